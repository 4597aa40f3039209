"""Rootfs templates (issue 33, step 1): locked from a Debian archive, realized without root.

A real archive: ``.deb`` files built here with ``dpkg-deb --build`` (or byte by byte, for the
members ``dpkg-deb`` would never write), a gzip'd Packages index, served over HTTP on
127.0.0.1 (``tests/debarchive.py``). ``harness lock image:LABEL`` and ``harness realize
image:LABEL`` run as processes, in empty homes. One ``network`` test locks and realizes a
real Debian package from the archive this machine's apt sources name (read at run time).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_harness_process
from tests.debarchive import DebArchive, dir_member, file_member, link_member

TEMPLATE = """\
summary = "a solver's root"
users = ["agent"]

[debian]
archive = "testdeb"
suite = "bookworm"
architecture = "amd64"
packages = [{packages}]
assume = ["libc6"]

[[files]]
path = "/tests"
source = "../../tests"

[[files]]
path = "/opt/solver/settings.txt"
source = "settings.txt"
"""


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[DebArchive]:
    found = DebArchive(tmp_path / "archive")
    found.add(
        "tool",
        "1.0-1",
        {"bin/tool": "#!/bin/sh\necho tool\n", "usr/share/doc/tool/README": "tool\n"},
        executable=("bin/tool",),
        depends="libfoo (>= 1.0) | libbar, libc6 (>= 2.34)",
        links={"usr/bin/tool-abs": "/bin/tool", "usr/share/doc/tool/rel": "README"},
        postinst="#!/bin/sh\necho configured > /var/lib/tool-configured\n",
    )
    found.add("libfoo", "1.2-1", {"usr/lib/libfoo.so.1": b"\x7fELF not really\n"})
    found.add("libfoo-old", "0.9-1", {"usr/lib/libfoo-old.so": b"old\n"})
    found.publish()
    found.serve()
    yield found
    found.close()


def _project(root: Path, packages: str = '"tool"') -> Path:
    (root / "services").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    os.chmod(root / "tests" / "test.sh", 0o755)
    images = root / "harbor" / "images"
    images.mkdir(parents=True)
    (images / "settings.txt").write_text("speed = 3\n")
    (images / "solver.toml").write_text(TEMPLATE.format(packages=packages))
    return root


def _harness(home: Path, project: Path, archive: DebArchive, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HARNESS_HOME": str(home), "HARNESS_DEBIAN_ARCHIVE_TESTDEB": archive.url}
    return run_harness_process("--project", str(project), *args, env=env)


def _content_hash(home: Path, name: str) -> str:
    from harness.store.store import Store

    record = Store.in_home(home).record(name)
    assert record is not None, f"{name} is not registered in {home}"
    return record.content


def test_lock_pins_closure_and_two_homes_realize_the_same_root(tmp_path: Path, archive: DebArchive) -> None:
    project = _project(tmp_path / "project")
    locked = _harness(tmp_path / "lock-home", project, archive, "lock", "image:solver")
    assert locked.returncode == 0, locked.stderr
    lock_file = project / "locks" / "images" / "solver.lock.toml"
    text = lock_file.read_text()
    # The closure: tool and the first alternative the index has; libc6 assumed (not pinned);
    # the other package of the index is not wanted. No address of the archive in the lock.
    assert re.findall(r'^name = "(.*)"$', text, re.M) == ["libfoo", "tool"]
    assert 'assumed = ["libc6"]' in text and "127.0.0.1" not in text and 'archive = "testdeb"' in text
    tool_deb = (archive.pool / "tool_1.0-1_amd64.deb").read_bytes()
    import hashlib

    assert hashlib.sha256(tool_deb).hexdigest() in text
    assert '"/tests/test.sh"' in text and '"/opt/solver/settings.txt"' in text
    # Re-locking unchanged inputs keeps the bytes without reading the archive (offline too);
    # --refresh reads it again, and its pins are the same; --check says it is current.
    served = len(archive.requests)
    for flags in ((), ("--offline",), ("--refresh",)):
        again = _harness(tmp_path / "lock-home", project, archive, "lock", "image:solver", *flags)
        assert again.returncode == 0 and "unchanged image:solver" in again.stderr, (flags, again.stderr)
        assert lock_file.read_text() == text
        assert (len(archive.requests) > served) == (flags == ("--refresh",)), flags
        served = len(archive.requests)
    assert _harness(tmp_path / "lock-home", project, archive, "lock", "--check", "image:solver").returncode == 0

    store_name = re.search(r'^store = "(.*)"$', text, re.M).group(1)  # type: ignore[union-attr]
    hashes = []
    for home in (tmp_path / "home-a", tmp_path / "home-b"):
        done = _harness(home, project, archive, "realize", "image:solver")
        assert done.returncode == 0, done.stderr
        assert f"image:solver: built -> {home / 'store' / store_name}" in done.stdout
        hashes.append(_content_hash(home, store_name))
    assert hashes[0] == hashes[1]

    root = tmp_path / "home-a" / "store" / store_name
    assert (root / "usr" / "bin" / "tool").read_text() == "#!/bin/sh\necho tool\n"  # merged /usr
    assert os.access(root / "usr" / "bin" / "tool", os.X_OK)
    assert not (root / "bin").exists()
    assert os.readlink(root / "usr" / "bin" / "tool-abs") == "tool"  # absolute made relative
    assert os.readlink(root / "usr" / "share" / "doc" / "tool" / "rel") == "README"
    assert (root / "usr" / "lib" / "libfoo.so.1").is_file()
    assert not (root / "usr" / "lib" / "libfoo-old.so").exists()
    assert (root / "tests" / "test.sh").read_text().startswith("#!/bin/bash")
    assert os.access(root / "tests" / "test.sh", os.X_OK)
    assert (root / "opt" / "solver" / "settings.txt").read_text() == "speed = 3\n"
    # The template's users, in the root's own /etc/passwd and /etc/group (the same in both homes).
    assert "agent:x:1000:1000:agent:/home/agent:/bin/bash\n" in (root / "etc" / "passwd").read_text()
    assert (root / "etc" / "group").read_text() == "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n"
    manifest = json.loads((root / ".harness-rootfs.json").read_text())
    assert manifest["maintainer_scripts"]["run"] is False
    assert manifest["maintainer_scripts"]["carried"] == {"tool": ["postinst"]}
    assert not (root / "var" / "lib" / "tool-configured").exists()
    # The project's template locks are gc roots: a collection keeps the root.
    gc = _harness(tmp_path / "home-a", project, archive, "store", "gc")
    assert gc.returncode == 0, gc.stderr
    assert root.is_dir()
    # Realized again: up to date, nothing downloaded.
    served = len(archive.requests)
    again = _harness(tmp_path / "home-a", project, archive, "realize", "image:solver")
    assert again.returncode == 0 and "image:solver: up to date" in again.stdout
    assert len(archive.requests) == served
    as_json = _harness(tmp_path / "home-a", project, archive, "realize", "image:solver", "--json")
    assert json.loads(as_json.stdout) == [{"name": "image:solver", "store": str(root), "built": False}]


def test_a_changed_file_makes_the_lock_stale(tmp_path: Path, archive: DebArchive) -> None:
    project = _project(tmp_path / "project")
    assert _harness(tmp_path / "h", project, archive, "lock", "image:solver").returncode == 0
    (project / "tests" / "test.sh").write_text("#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n")
    check = _harness(tmp_path / "h", project, archive, "lock", "--check", "image:solver")
    assert check.returncode == 1 and "stale  image:solver" in check.stdout
    offline = _harness(tmp_path / "h", project, archive, "lock", "image:solver", "--offline")
    assert offline.returncode != 0 and "--offline forbids reading it" in offline.stderr
    done = _harness(tmp_path / "h", project, archive, "realize", "image:solver")
    assert done.returncode == 2
    assert "template solver: its lock is stale: a file the template takes changed" in done.stderr
    assert "harness lock image:solver" in done.stderr and "Traceback" not in done.stderr
    assert not list((tmp_path / "h" / "store").glob("*-rootfs-solver"))


def test_unknown_package_and_bad_template_are_refused(tmp_path: Path, archive: DebArchive) -> None:
    project = _project(tmp_path / "project", packages='"tool", "no-such-package"')
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 2, done.stderr
    assert "harbor/images/solver.toml" in done.stderr and "'no-such-package'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (project / "locks" / "images" / "solver.lock.toml").exists()

    (project / "harbor" / "images" / "solver.toml").write_text(
        TEMPLATE.format(packages='"tool"').replace("suite =", "sweet = 1\nsuite =")
    )
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert "solver.toml: unknown key(s) debian.sweet" in done.stderr and "Traceback" not in done.stderr
    # An archive nobody configured: named, with where to set it.
    (project / "harbor" / "images" / "solver.toml").write_text(TEMPLATE.format(packages='"tool"'))
    done = run_harness_process(
        "--project", str(project), "lock", "image:solver", env={"HARNESS_HOME": str(tmp_path / "h")}
    )
    assert done.returncode != 0 and "Debian archive 'testdeb' has no address" in done.stderr
    assert "[debian-archives]" in done.stderr


def test_a_deb_that_changed_on_the_archive_is_refused(tmp_path: Path, archive: DebArchive) -> None:
    project = _project(tmp_path / "project")
    assert _harness(tmp_path / "h", project, archive, "lock", "image:solver").returncode == 0
    deb = archive.pool / "libfoo_1.2-1_amd64.deb"
    import hashlib

    expected = hashlib.sha256(deb.read_bytes()).hexdigest()
    archive.add("libfoo", "1.2-1", {"usr/lib/libfoo.so.1": b"other bytes, same size?\n"})
    actual = hashlib.sha256(deb.read_bytes()).hexdigest()
    done = _harness(tmp_path / "h", project, archive, "realize", "image:solver")
    assert done.returncode == 1
    assert "libfoo_1.2-1_amd64.deb" in done.stderr and expected in done.stderr
    assert "got sha256" in done.stderr and (actual in done.stderr or "bytes)" in done.stderr)
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "h" / "store").glob("*-rootfs-solver"))


ESCAPES = {
    "dotdot": ([(file_member("./usr/../../escaped"), b"x")], "escapes the root"),
    "absolute": ([(file_member("/etc/escaped"), b"x")], "has an absolute path"),
    "link-climbs": ([dir_member("./usr"), link_member("./usr/up", "../../../../etc")], "escapes the root"),
    "through-link": (
        [dir_member("./usr"), link_member("./usr/etc", "/etc"), (file_member("./usr/etc/passwd"), b"x")],
        "written through the symlink",
    ),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_debs_escaping_the_root_are_refused(tmp_path: Path, archive: DebArchive, case: str) -> None:
    members, message = ESCAPES[case]
    archive.add_raw("evil", "1", members)
    archive.publish()
    project = _project(tmp_path / "project", packages='"evil"')
    assert _harness(tmp_path / "h", project, archive, "lock", "image:solver").returncode == 0
    done = _harness(tmp_path / "h", project, archive, "realize", "image:solver")
    assert done.returncode == 1, done.stdout
    assert "evil_1_amd64.deb (evil)" in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "h" / "store").glob("*-rootfs-solver"))
    assert not (tmp_path / "h" / "escaped").exists() and not (tmp_path / "escaped").exists()


def _apt_archive() -> str | None:
    """The Debian archive this machine's apt sources name (read at run time, never written down)."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for text in texts:
        for match in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            url = match.group(1) or match.group(2)
            if url and url.startswith("http") and "security" not in url:
                return url
    return None


@pytest.mark.network
def test_a_real_debian_package(tmp_path: Path) -> None:
    """``hello`` from the machine's Debian archive (bookworm): locked with its closure less libc6,
    realized in two empty homes to the same content; the binary runs against the host's libc."""
    url = _apt_archive()
    if url is None or not Path("/etc/debian_version").exists():
        pytest.skip("no Debian archive in this machine's apt sources")
    project = tmp_path / "project"
    (project / "services").mkdir(parents=True)
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "harbor" / "images" / "hello.toml").write_text(
        '[debian]\narchive = "debian"\nsuite = "bookworm"\narchitecture = "amd64"\n'
        'packages = ["hello"]\nassume = ["libc6"]\n'
    )
    env = {"HARNESS_DEBIAN_ARCHIVE_DEBIAN": url}
    locked = run_harness_process(
        "--project", str(project), "lock", "image:hello", env={**env, "HARNESS_HOME": str(tmp_path / "h0")}, timeout=300
    )
    assert locked.returncode == 0, locked.stderr
    text = (project / "locks" / "images" / "hello.lock.toml").read_text()
    assert 'name = "hello"' in text and url not in text
    names = []
    for home in ("ha", "hb"):
        done = run_harness_process(
            "--project",
            str(project),
            "realize",
            "image:hello",
            env={**env, "HARNESS_HOME": str(tmp_path / home)},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        names.append(done.stdout.split("-> ")[1].strip())
    name = Path(names[0]).name
    assert _content_hash(tmp_path / "ha", name) == _content_hash(tmp_path / "hb", name)
    out = subprocess.run([f"{names[0]}/usr/bin/hello"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Hello, world!"
    assert sys.platform == "linux"


# ------------------------------------------------------------------------------ pure parts


def test_dpkg_version_order_and_relations() -> None:
    from harness.resolve.debian import compare_versions, parse_relations

    ordered = ["1.0~rc1", "1.0", "1.0-1", "1.0-1+b1", "1.0a", "1.0.1", "1:0.1"]
    for low, high in zip(ordered, ordered[1:], strict=False):
        assert compare_versions(low, high) < 0 < compare_versions(high, low), (low, high)
    assert compare_versions("2.36-9+deb12u4", "2.36-9+deb12u4") == 0
    assert parse_relations("libc6 (>= 2.34), libfoo:any | libbar [amd64], awk") == [
        [("libc6", ">= 2.34")],
        [("libfoo", ""), ("libbar", "")],
        [("awk", "")],
    ]


def test_closure_takes_providers_newest_versions_and_names_what_is_missing() -> None:
    from harness.errors import InputError
    from harness.resolve.debian import closure

    def stanza(name: str, version: str, **fields: str) -> dict[str, str]:
        sha = (name + version).encode().hex().ljust(64, "0")[:64]
        return {
            "Package": name,
            "Version": version,
            "Filename": f"pool/{name}.deb",
            "Size": "1",
            "SHA256": sha,
            **fields,
        }

    index = [
        stanza("tool", "1", Depends="awk, libc6"),
        stanza("mawk", "1.3", Provides="awk"),
        stanza("gawk", "5", Provides="awk"),
        stanza("tool", "2", Depends="awk, libc6"),
    ]
    pins = closure(index, ("tool",), ("libc6",), "t.toml")
    # gawk: the first provider by name; tool 2: the newest.
    assert [(p.name, p.version) for p in pins] == [("gawk", "5"), ("tool", "2")]
    with pytest.raises(InputError, match="t.toml: tool Depends: awk: not in the archive"):
        closure(index[:1], ("tool",), (), "t.toml")
    with pytest.raises(InputError, match="'nope' is not in the archive"):
        closure(index, ("nope",), (), "t.toml")


def test_a_file_changed_under_realize_is_refused_naming_both_hashes(tmp_path: Path) -> None:
    """Below the CLI's staleness check: the builder itself checks each of the project's files
    against the lock's sha256 (a file changed between the check and the build)."""
    import hashlib

    from harness.config import Settings
    from harness.lock.images import lock_template, read
    from harness.realize.rootfs import RootfsError, realize_template
    from harness.store.store import Store

    project = tmp_path / "p"
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "harbor" / "t.sh").write_text("echo 1\n")
    (project / "harbor" / "images" / "x.toml").write_text('[[files]]\npath = "/tests/t.sh"\nsource = "../t.sh"\n')
    lock_template(project, "x", None)
    lock = read(project, "x")
    (project / "harbor" / "t.sh").write_text("echo 0\n")
    store = Store.in_home(tmp_path / "home")
    with pytest.raises(RootfsError) as failed:
        realize_template(store, Settings(), lock, project)
    message = str(failed.value)
    assert "harbor/t.sh does not match the lock" in message and lock.files[0].sha256 in message
    assert hashlib.sha256(b"echo 0\n").hexdigest() in message
    assert not store.is_registered(lock.store)


def test_provides_maps_docker_bases_to_templates(tmp_path: Path) -> None:
    """``provides`` in a template: its references normalized (docker.io/library/, :latest), every
    label and reference mapped to its template, two templates providing one base refused naming
    both files."""
    from harness.errors import InputError
    from harness.manifests.template import bases, normalize_reference

    assert normalize_reference("docker.io/library/debian") == "debian:latest"
    assert normalize_reference("python:3.12-slim@sha256:00") == "python:3.12-slim"
    images = tmp_path / "harbor" / "images"
    images.mkdir(parents=True)
    (tmp_path / "harbor" / "f.txt").write_text("f\n")
    files = '\n[[files]]\npath = "/f"\nsource = "../f.txt"\n'
    (images / "lab.toml").write_text('provides = ["library/debian:bookworm", "lab/base"]\n' + files)
    (images / "other.toml").write_text(files)
    assert bases(tmp_path) == {
        "lab": "lab",
        "other": "other",
        "debian:bookworm": "lab",
        "lab/base:latest": "lab",
    }
    (images / "other.toml").write_text('provides = ["debian:bookworm"]\n' + files)
    with pytest.raises(InputError, match=r"provides: 'debian:bookworm' is provided by .*lab.toml too"):
        bases(tmp_path)
