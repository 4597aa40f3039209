"""Bad input: one clear message naming file and key, exit 2 (1 for a failure), no traceback.

Manifests (services/, benchmarks/) and deploys: each corpus file under tests/data/bad/ starts with
``# expect: <text>``: the message must contain that text. Locks, cache entries, full and
read-only homes and special weights paths follow (issue 12).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

BAD = Path(__file__).parent / "data" / "bad"


def _expectation(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path} lacks its '# expect:' line"
    return first.removeprefix("# expect: ")


def _project(tmp_path: Path) -> Path:
    (tmp_path / "services").mkdir()
    shutil.copy(REPO / "services" / "sam3.toml", tmp_path / "services" / "sam3.toml")
    return tmp_path


@pytest.mark.parametrize("path", sorted((BAD / "services").glob("*.toml")), ids=lambda p: p.stem)
def test_bad_manifest(path: Path, tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    shutil.copy(path, project / "services" / path.name)
    for command in (["services"], ["validate"]):
        result = harness_cli("--project", str(project), *command)
        assert result.code == 2, result
        assert _expectation(path) in result.err
        assert path.name in result.err
        assert "Traceback" not in result.err + result.out


@pytest.mark.parametrize("path", sorted((BAD / "benchmarks").glob("*.toml")), ids=lambda p: p.stem)
def test_bad_benchmark(path: Path, tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    (project / "benchmarks").mkdir()
    shutil.copy(path, project / "benchmarks" / path.name)
    for command in (["services"], ["validate"]):
        result = harness_cli("--project", str(project), *command)
        assert result.code == 2, result
        assert _expectation(path) in result.err
        assert f"benchmarks/{path.name}" in result.err
        assert "Traceback" not in result.err + result.out


@pytest.mark.parametrize("path", sorted((BAD / "deploy").glob("*.toml")), ids=lambda p: p.stem)
def test_bad_deploy(path: Path, tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    result = harness_cli("--project", str(project), "--deploy", str(path), "validate")
    assert result.code == 2, result
    assert _expectation(path) in result.err
    assert path.name in result.err
    assert "Traceback" not in result.err + result.out


@pytest.mark.parametrize("path", sorted((BAD / "images").glob("*.toml")), ids=lambda p: p.stem)
def test_bad_rootfs_template(path: Path, tmp_path: Path, harness_cli) -> None:
    """A rootfs template (harbor/images/<label>.toml) with a bad key: exit 2 naming file and key,
    and no lock written."""
    project = _project(tmp_path)
    (project / "harbor" / "images").mkdir(parents=True)
    shutil.copy(path, project / "harbor" / "images" / "solver.toml")
    result = harness_cli("--home", str(tmp_path / "home"), "--project", str(project), "lock", "image:solver")
    assert result.code == 2, (result.out, result.err)
    assert _expectation(path) in result.err, result.err
    assert "harbor/images/solver.toml" in result.err and "Traceback" not in result.err
    assert not (project / "locks" / "images").exists()


@pytest.mark.parametrize(
    ("settings", "expect"),
    [
        (
            '[debian-archives.debian]\nkeyring = "https://x.example/k.gpg"\n',
            "debian-archives.debian.keyring: expected a path",
        ),
        (
            "[debian-archives.debian]\nallow-unsigned = 1\n",
            "debian-archives.debian.allow-unsigned: expected true or false",
        ),
        ('[debian-archives.debian]\nkeyrings = "/k.gpg"\n', "debian-archives.debian.keyrings: unknown key"),
        ('[debian-archives.debian]\nurl = "ftp://x"\n', "debian-archives.debian.url: expected an http(s)://"),
        ("[debian-archives]\ndebian = 3\n", "debian-archives.debian: expected an address or a table"),
    ],
    ids=["keyring-url", "unsigned-type", "unknown-key", "url-scheme", "not-a-table"],
)
def test_bad_debian_archive_settings(tmp_path: Path, harness_cli, settings: str, expect: str) -> None:
    """``[debian-archives]`` settings that cannot say where an archive is or how it is trusted:
    exit 2 naming the settings file and the key, before the archive is read, no lock written."""
    project = _project(tmp_path)
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "harbor" / "images" / "solver.toml").write_text(
        '[debian]\narchive = "debian"\nsuite = "bookworm"\narchitecture = "amd64"\npackages = ["hello"]\n'
    )
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(settings)
    result = harness_cli("--home", str(home), "--project", str(project), "lock", "image:solver")
    assert result.code == 2, (result.out, result.err)
    assert f"{home / 'config.toml'}: {expect}" in result.err, result.err
    assert "Traceback" not in result.err and not (project / "locks" / "images").exists()


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (('store = "', 'store = "0'), "store: 0"),
        (('path = "/tests/t.sh"', 'path = "/../t.sh"'), "a path outside the root or the project"),
        (("lock-version = 1", "lock-version = 9"), "lock-version: expected 1"),
        (('sha256 = "', 'sha256 = 7 #"'), "malformed template lock"),
    ],
    ids=["store-name", "path-escapes", "version", "type"],
)
def test_bad_rootfs_template_lock(tmp_path: Path, harness_cli, edit: tuple[str, str], expect: str) -> None:
    """A template's lock edited by hand: realize refuses it (exit 2) naming the file, builds nothing."""
    project = _project(tmp_path)
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "harbor" / "t.sh").write_text("echo\n")
    (project / "harbor" / "images" / "solver.toml").write_text('[[files]]\npath = "/tests/t.sh"\nsource = "../t.sh"\n')
    home = str(tmp_path / "home")
    assert harness_cli("--home", home, "--project", str(project), "lock", "image:solver").code == 0
    lock = project / "locks" / "images" / "solver.lock.toml"
    lock.write_text(lock.read_text().replace(*edit, 1))
    result = harness_cli("--home", home, "--project", str(project), "realize", "image:solver")
    assert result.code == 2, (result.out, result.err)
    assert "locks/images/solver.lock.toml" in result.err and expect in result.err, result.err
    assert "Traceback" not in result.err and not list((tmp_path / "home" / "store").glob("*-rootfs-*"))


@pytest.mark.parametrize(
    ("pin", "expect"),
    [
        ({"sha256": "../../../../victim"}, "debian.package 'tool': sha256: not 64 hexadecimal digits"),
        ({"filename": "../../etc/passwd.deb"}, "debian.package 'tool': filename: not a path in the archive's pool"),
        ({"filename": "pool/t/tool.deb?x=/"}, "debian.package 'tool': filename: not a path in the archive's pool"),
    ],
    ids=["sha256-climbs", "filename-climbs", "filename-query"],
)
def test_a_template_lock_naming_files_outside_its_folders_is_refused(
    tmp_path: Path, harness_cli, pin: dict[str, str], expect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template lock whose package pins name a download outside cache/debs (its sha256 is a
    file name there) or an address outside the archive's pool, with the store name made to
    match (it is computed from the pins): refused naming file and key, nothing written."""
    from harness.lock.images import LOCK_VERSION, TemplateLock, dumps, lock_path, store_name
    from harness.resolve.debian import DebPin

    project = _project(tmp_path)
    (project / "harbor" / "images").mkdir(parents=True)
    template = project / "harbor" / "images" / "solver.toml"
    template.write_text('[debian]\narchive = "a"\nsuite = "bookworm"\narchitecture = "amd64"\npackages = ["tool"]\n')
    fields = {"filename": "pool/t/tool_1_amd64.deb", "sha256": "0" * 64, **pin}
    packages = (DebPin("tool", "1", "amd64", fields["filename"], 10, fields["sha256"]),)
    lock = TemplateLock(
        label="solver",
        template_sha256=hashlib.sha256(template.read_bytes()).hexdigest(),  # not stale
        store=store_name("solver", packages, (), ()),
        users=(),
        environment=None,
        environment_store=None,
        archive="a",
        suite="bookworm",
        components=("main",),
        architecture="amd64",
        assumed=(),
        packages=packages,
        files=(),
    )
    path = lock_path(project, "solver")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(lock))
    assert f"lock-version = {LOCK_VERSION}" in path.read_text()
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_DEBIAN_ARCHIVE_A", "http://127.0.0.1:9")  # nothing answers
    result = harness_cli("--home", str(home), "--project", str(project), "realize", "image:solver")
    assert result.code == 2, (result.out, result.err)
    assert "locks/images/solver.lock.toml" in result.err and expect in result.err, result.err
    assert "Traceback" not in result.err and not list(tmp_path.glob("victim*"))
    assert not (home / "cache" / "debs").exists()


def test_an_external_services_client_may_use_only_its_url(tmp_path: Path, harness_cli) -> None:
    """harness runs nothing of an external service, so its client table's {weights} (or
    {python}, {port}, {source:NAME}) has no value: refused when the deploy is loaded, naming
    the deploy's key and the manifest's."""
    project = _project(tmp_path)
    manifest = project / "services" / "sam3.toml"
    table = 'client = { url = "{url}", checkpoint = "{weights}/sam3/sam3.pt" }'
    manifest.write_text(manifest.read_text().replace('client = { url = "{url}" }', table))
    deploy = tmp_path / "lab.toml"
    deploy.write_text('[services.sam3]\nmode = "external"\nurl = "http://gpu-box:8810"\n')
    for command in (["validate"], ["plan", "--gpus", "1x24"]):
        result = harness_cli("--project", str(project), "--deploy", str(deploy), *command)
        assert result.code == 2, result
        assert "lab.toml: services.sam3" in result.err
        assert "services/sam3.toml: client.checkpoint uses {weights}" in result.err
        assert "client.url" not in result.err  # {url} is fine
        assert "Traceback" not in result.err + result.out
    # Resident, the same table is filled at launch: the deploy is fine.
    deploy.write_text('[services.sam3]\nmode = "resident"\n')
    assert harness_cli("--project", str(project), "--deploy", str(deploy), "validate").code == 0


def test_a_broken_manifest_a_deploy_names_is_reported_once(tmp_path: Path, harness_cli) -> None:
    """validate loads an external service's manifest again for its deploy: one line, not two."""
    project = _project(tmp_path)
    manifest = project / "services" / "sam3.toml"
    manifest.write_text(manifest.read_text() + "\nno_such_key = 1\n")
    deploy = tmp_path / "lab.toml"
    deploy.write_text('[services.sam3]\nmode = "external"\nurl = "http://gpu-box:8810"\n')
    result = harness_cli("--project", str(project), "--deploy", str(deploy), "validate")
    assert result.code == 2, result
    lines = [line for line in result.err.splitlines() if "no_such_key" in line]
    assert len(lines) == 1, result.err
    assert "services/sam3.toml" in lines[0]


def test_every_problem_reported_at_once(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    for name in ("unknown_key.toml", "missing_field.toml"):
        shutil.copy(BAD / "services" / name, project / "services" / name)
    result = harness_cli("--project", str(project), "services")
    assert result.code == 2
    assert "unknown_key.toml" in result.err and "missing_field.toml" in result.err


def test_bad_manifest_name(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    shutil.copy(REPO / "services" / "sam3.toml", project / "services" / "Bad Name.toml")
    result = harness_cli("--project", str(project), "services")
    assert result.code == 2
    assert "manifest name 'Bad Name'" in result.err


def test_no_project(tmp_path: Path, harness_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = harness_cli("services")
    assert result.code == 2
    assert "no harness project" in result.err
    result = harness_cli("--project", str(tmp_path), "services")
    assert result.code == 2 and "no services/ folder" in result.err


def test_bad_override(harness_cli) -> None:
    result = harness_cli("--project", str(REPO), "closure", "--set", "nonsense")
    assert result.code == 2 and "expected KEY=VALUE" in result.err


# ---------------------------------------------------------------- locks, caches, disks (issue 12)
#
# Bad input past the manifests: a hand-edited lock, a hostile cache entry, a full or read-only
# home, a weights path that names a special file. Each gets one short message naming what is
# wrong (exit 2 for bad input, 1 for a failure), writes nothing outside the home and the
# project, and leaves a store that verifies.


def _edit_lock(project: Path, tmp_path: Path, old: str, new: str) -> Path:
    """A copy of ``project`` whose svc lock has ``old`` replaced by ``new`` (first match)."""
    copy = tmp_path / "project"
    shutil.copytree(project, copy, symlinks=True)
    lock = copy / "locks" / "svc.lock.toml"
    text = lock.read_text()
    assert old in text, old
    lock.write_text(text.replace(old, new, 1))
    return copy


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("bad", ["../../../escaped", "x/../../escaped", "a/b", ".hidden"])
def test_lock_store_name_outside_the_store_is_refused_before_any_file(
    bad: str, svc: Path, tmp_path: Path, harness_cli
) -> None:
    from harness.lock.lockfile import read

    lock = read(svc / "locks" / "svc.lock.toml")
    victim = lock.packages[0].wheels[0].store
    project = _edit_lock(svc, tmp_path, f'store = "{victim}"', f'store = "{victim[:33]}{bad}"')
    home = tmp_path / "area" / "home"
    result = harness_cli("--project", str(project), "--home", str(home), "realize")
    assert result.code == 2, result
    assert "svc.lock.toml" in result.err and "is not a store path name" in result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    assert _tree(tmp_path / "area") == []  # not even a lock file, in the home or beside it


def test_unknown_lock_version_is_refused_naming_the_readable_ones(svc: Path, tmp_path: Path, harness_cli) -> None:
    project = _edit_lock(svc, tmp_path, "lock-version = 1\n", "lock-version = 99\n")
    home = tmp_path / "home"
    # `lock --check` reports a stale lock (exit 1); the others refuse the input (exit 2).
    for command, code in ((["realize"], 2), (["store", "path", "svc"], 2), (["lock", "--check"], 1)):
        result = harness_cli("--project", str(project), "--home", str(home), *command)
        assert result.code == code, (command, result)
        said = result.err + result.out
        assert "lock-version 99 is not one this harness reads (it reads 1, 2)" in said, said
        assert "svc.lock.toml" in said
    assert _tree(home / "store") == []


def test_lock_file_names_that_climb_are_refused(svc: Path, tmp_path: Path, harness_cli) -> None:
    from harness.lock.lockfile import read

    lock = read(svc / "locks" / "svc.lock.toml")
    wheel = lock.packages[0].wheels[0].file
    project = _edit_lock(svc, tmp_path, f'file = "{wheel}"', 'file = "../../../../tmp/planted.whl"')
    result = harness_cli("--project", str(project), "--home", str(tmp_path / "home"), "realize")
    assert result.code == 2 and "is not a plain file name" in result.err, result


def test_cache_entry_listing_itself_is_refused_not_waited_on(tmp_path: Path) -> None:
    from harness.store.store import Store
    from tests.test_cache import BAD, _assert_untouched, _dir, _file, _nar, _pull, publish

    cache = tmp_path / "cache"
    publish(cache, BAD, _nar(_dir(("a", _file()))), refs=(BAD,))
    store = Store(tmp_path / "b" / "store")
    pulled = _pull(store, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert pulled.registered == [] and "itself among its references" in pulled.failed[BAD]
    _assert_untouched(store)


def test_cache_entry_larger_than_the_free_space_is_refused_before_writing(tmp_path: Path) -> None:
    from harness.store.store import Store
    from tests.test_cache import BAD, _assert_untouched, _dir, _file, _nar, _pull, publish

    cache = tmp_path / "cache"
    huge = shutil.disk_usage(tmp_path).free * 4 + (1 << 40)
    publish(cache, BAD, _nar(_dir(("a", _file()))), nar_size=huge)
    store = Store(tmp_path / "b" / "store")
    pulled = _pull(store, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert pulled.registered == []
    assert f"needs {huge} bytes" in pulled.failed[BAD] and "nothing was written" in pulled.failed[BAD]
    _assert_untouched(store)


def _mount_tmpfs(target: Path, size: str, *options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], capture_output=True, check=False
        ).returncode
        == 0
    )


needs_mount = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="needs root to mount a small tmpfs (the root run of CI covers it)",
)


@pytest.mark.root
@needs_mount
def test_full_disk_during_realize_is_a_short_failure_and_the_store_verifies(
    svc: Path, tmp_path: Path, harness_cli
) -> None:
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "24m"):
        pytest.skip("mounting a tmpfs failed here (a container without CAP_SYS_ADMIN?)")
    try:
        home = disk / "home"
        result = harness_cli("--project", str(svc), "--home", str(home), "realize")
        assert result.code == 1, result
        assert "no space left" in result.err.lower(), result.err
        assert len(result.err) < 1500 and "internal error" not in result.err and "Traceback" not in result.err
        verified = harness_cli("--home", str(home), "store", "verify", "--check-contents")
        assert verified.code == 0, verified
        assert _tree(home / "store" / ".tmp") == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.root  # by mount as root; the unprivileged run checks it by mode
def test_read_only_home_is_a_short_failure(svc: Path, tmp_path: Path, harness_cli) -> None:
    """Read-only by mount as root (permissions do not stop root), by mode otherwise."""
    home = tmp_path / "ro" / "home"
    if os.geteuid() == 0:
        if not _mount_tmpfs(tmp_path / "ro", "4m", "ro"):
            pytest.skip("mounting a tmpfs failed here (a container without CAP_SYS_ADMIN?)")
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
    try:
        result = harness_cli("--project", str(svc), "--home", str(home), "realize")
        assert result.code == 1, result
        assert "read-only file system" in result.err or "permission denied" in result.err, result.err
        assert "hint: make it writable" in result.err and len(result.err) < 600
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=False)
        else:
            (tmp_path / "ro").chmod(0o755)


def _special_paths(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "weights.fifo"
    os.mkfifo(fifo)
    sock = tmp_path / "weights.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()
    return {
        "proc": Path("/proc/cpuinfo"),
        "proc folder": Path("/proc/self"),
        "sys": Path("/sys/kernel"),
        "dev": Path("/dev/zero"),
        "fifo": fifo,
        "socket": sock,
        "link to dev": _link(tmp_path, "/dev/null"),
    }


def _link(tmp_path: Path, target: str) -> Path:
    link = tmp_path / "innocent-name"
    link.symlink_to(target)
    return link


def test_weights_path_naming_a_special_file_is_refused_at_lock_time(tmp_path: Path) -> None:
    from harness.config import Settings
    from harness.errors import InputError
    from harness.manifests.model import Weights
    from harness.resolve.weights import lock_weights

    for what, path in _special_paths(tmp_path).items():
        with pytest.raises(InputError) as refused:
            lock_weights(
                Weights(dir="w", path=str(path)),
                project_root=tmp_path,
                settings=Settings(),
                cache_dir=tmp_path / "cache",
            )
        assert str(path) in refused.value.message, what
        assert "pseudo-filesystem" in refused.value.message or "not a file or folder" in refused.value.message, what
    # An absolute path outside the project is allowed (documented): a regular folder locks.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model.bin").write_bytes(b"w")
    pinned = lock_weights(
        Weights(dir="w", path=str(outside)),
        project_root=tmp_path / "project",
        settings=Settings(),
        cache_dir=tmp_path / "cache",
    )
    assert [f.path for f in pinned.files] == ["model.bin"]


def test_git_network_waits_have_a_limit() -> None:
    """git would otherwise wait forever on a server that stops sending (issue 12)."""
    from harness.resolve.git import _environment

    env = _environment()
    assert env["GIT_HTTP_LOW_SPEED_LIMIT"] and env["GIT_HTTP_LOW_SPEED_TIME"]
    assert "ConnectTimeout" in env.get("GIT_SSH_COMMAND", "ConnectTimeout") or "GIT_SSH" in os.environ


# ------------------------------------------------------------ bounded documents (issue 29)
#
# Every document harness reads is bounded (harness/manifests/tomlfile.py): integers beyond
# signed 64 bits, nesting beyond 32 levels, arrays or tables beyond 50,000 entries and files
# beyond 32 MiB are refused with one line naming the file and the key, never "internal error".

HUGE = "9" * 5000


def _refused(result, *expected: str) -> str:
    said = result.err + result.out
    assert "Traceback" not in said and "internal error" not in said, said
    for text in expected:
        assert text in said, (text, said)
    return said


def _one_line_with(said: str, *texts: str) -> None:
    assert any(all(t in line for t in texts) for line in said.splitlines()), (texts, said)


def test_an_integer_of_thousands_of_digits_in_a_lock_is_refused(svc: Path, tmp_path: Path, harness_cli) -> None:
    from harness.lock.lockfile import read

    size = read(svc / "locks" / "svc.lock.toml").packages[0].wheels[0].size
    project = _edit_lock(svc, tmp_path, f"size = {size},", f"size = {HUGE},")
    home = tmp_path / "home"
    for command, code in ((["realize"], 2), (["store", "path", "svc"], 2), (["lock", "--check"], 1)):
        result = harness_cli("--project", str(project), "--home", str(home), *command)
        assert result.code == code, (command, result)
        said = _refused(result)
        _one_line_with(said, "svc.lock.toml", "size: an integer of 5,000 digits")


def test_an_integer_beyond_64_bits_in_a_lock_is_refused_naming_its_key(svc: Path, tmp_path: Path, harness_cli) -> None:
    project = _edit_lock(svc, tmp_path, "lock-version = 1\n", f"lock-version = {1 << 70}\n")
    result = harness_cli("--project", str(project), "--home", str(tmp_path / "home"), "realize")
    assert result.code == 2, result
    _one_line_with(_refused(result), "svc.lock.toml", "lock-version: an integer of 22 digits")


def test_a_lock_version_nested_thousands_deep_is_refused(svc: Path, tmp_path: Path, harness_cli) -> None:
    deep = "[" * 5000 + "1" + "]" * 5000
    project = _edit_lock(svc, tmp_path, "lock-version = 1\n", f"lock-version = {deep}\n")
    home = tmp_path / "home"
    for command, code in ((["realize"], 2), (["store", "path", "svc"], 2), (["lock", "--check"], 1)):
        result = harness_cli("--project", str(project), "--home", str(home), *command)
        assert result.code == code, (command, result)
        _one_line_with(_refused(result), "svc.lock.toml", "lock-version: nested deeper than 32 levels")


def test_a_lock_version_nested_past_the_limit_is_refused_naming_its_key(svc: Path, tmp_path: Path, harness_cli) -> None:
    deep = "[" * 40 + "1" + "]" * 40  # parses, then the bound refuses it with the key's full path
    project = _edit_lock(svc, tmp_path, "lock-version = 1\n", f"lock-version = {deep}\n")
    result = harness_cli("--project", str(project), "--home", str(tmp_path / "home"), "realize")
    assert result.code == 2, result
    _one_line_with(_refused(result), "svc.lock.toml", "lock-version[0]", "nested deeper than 32 levels")


def test_a_lock_version_written_as_a_string_is_refused(svc: Path, tmp_path: Path, harness_cli) -> None:
    project = _edit_lock(svc, tmp_path, "lock-version = 1\n", 'lock-version = "1"\n')
    for command, code in ((["realize"], 2), (["lock", "--check"], 1)):
        result = harness_cli("--project", str(project), "--home", str(tmp_path / "home"), *command)
        assert result.code == code, (command, result)
        _one_line_with(_refused(result), "svc.lock.toml", "lock-version: Input should be a valid integer")


def test_a_manifest_with_200000_requirements_is_refused(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    manifest = project / "services" / "sam3.toml"
    text = manifest.read_text()
    assert "\nrequirements = [" in text
    many = ", ".join(f'"pkg{i}==1.0"' for i in range(200_000))
    manifest.write_text(text.replace("\nrequirements = [", f"\nrequirements = [{many}, ", 1))
    result = harness_cli("--project", str(project), "validate")
    assert result.code == 2, result
    _one_line_with(
        _refused(result), "services/sam3.toml", "environment.requirements: an array of 200,005 entries", "50,000"
    )


def test_a_manifest_beyond_the_size_limit_is_refused_unread(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    with open(project / "services" / "huge.toml", "wb") as handle:
        handle.truncate((32 << 20) + 1)  # sparse: a file of that size costs no disk
    result = harness_cli("--project", str(project), "validate")
    assert result.code == 2, result
    _one_line_with(_refused(result), "services/huge.toml", "33,554,433 bytes, over the 32 MiB")


def test_a_deploy_with_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    deploy = tmp_path / "lab.toml"
    deploy.write_text(f'gpus = [0]\n\n[services.sam3]\nmode = "on_demand"\ngpu = {HUGE}\n')
    result = harness_cli("--project", str(project), "--deploy", str(deploy), "validate")
    assert result.code == 2, result
    _one_line_with(_refused(result), "lab.toml:5", "gpu: an integer of 5,000 digits")


def test_an_agent_config_with_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    (project / "configs" / "agents").mkdir(parents=True)
    (project / "configs" / "agents" / "big.toml").write_text(f'[agent]\nname = "big"\nepisodes = {HUGE}\n')
    result = harness_cli("--project", str(project), "validate")
    assert result.code == 2, result
    _one_line_with(_refused(result), "configs/agents/big.toml:3", "episodes: an integer of 5,000 digits")
    result = harness_cli("--project", str(project), "plan", "--agent", "big", "--gpus", "1x24")
    assert result.code == 2, result
    _one_line_with(_refused(result), "configs/agents/big.toml:3", "episodes")


def test_an_override_with_an_integer_of_thousands_of_digits_is_refused(harness_cli) -> None:
    for value in (HUGE, "[" * 5000):
        result = harness_cli("--project", str(REPO), "closure", "--set", f"agent.x={value}")
        assert result.code == 2, result
        _one_line_with(_refused(result), "--set agent.x", "beyond what harness reads")


def test_settings_with_an_integer_of_thousands_of_digits_are_refused(tmp_path: Path, harness_cli) -> None:
    project = _project(tmp_path)
    (project / "harness.toml").write_text(f"[gc]\nkeep-runs = {HUGE}\n")
    result = harness_cli("--project", str(project), "--home", str(tmp_path / "home"), "lock", "--check")
    assert result.code == 2, result
    _one_line_with(_refused(result), "harness.toml:2", "keep-runs: an integer of 5,000 digits")
