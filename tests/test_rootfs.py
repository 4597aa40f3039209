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
from tests.debarchive import (
    DebArchive,
    Signer,
    dir_member,
    file_member,
    host_shell_files,
    link_member,
    make_signers,
    stop_agent,
)

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


@pytest.fixture(scope="module")
def signers() -> Iterator[list[Signer]]:
    """Two signing keys: the archive's, and another nobody trusts (a short GNUPGHOME: gpg-agent's
    socket path must fit)."""
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="hgpg-")) / "g"
    try:
        yield make_signers(home, ("archive", "stranger"))
    finally:
        stop_agent(home)
        shutil.rmtree(home.parent, ignore_errors=True)


@pytest.fixture
def archive(tmp_path: Path, signers: list[Signer]) -> Iterator[DebArchive]:
    found = DebArchive(tmp_path / "archive", signer=signers[0])
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


def _harness(
    home: Path, project: Path, archive: DebArchive, *args: str, trust: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``harness ARGS`` with the test archive's address, trusting its keyring (or ``trust``)."""
    keyring = {"HARNESS_DEBIAN_KEYRING_TESTDEB": str(archive.signer.keyring)} if archive.signer else {}
    env = {
        "HARNESS_HOME": str(home),
        "HARNESS_DEBIAN_ARCHIVE_TESTDEB": archive.url,
        **(keyring if trust is None else trust),
    }
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
    # How the index was trusted: its InRelease verified, by the archive's key.
    assert 'release = "InRelease verified with gpgv"' in text
    assert f'signed-by = ["{archive.signer.fingerprint}"]' in text  # type: ignore[union-attr]
    assert str(archive.signer.keyring) not in text  # type: ignore[union-attr]
    tool_deb = (archive.pool / "tool_1.0-1_amd64.deb").read_bytes()
    assert "/dists/bookworm/InRelease" in archive.requests
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


def test_a_tampered_index_or_a_wrong_key_fails_lock_naming_what_was_expected(
    tmp_path: Path, archive: DebArchive, signers: list[Signer]
) -> None:
    """InRelease (issue 33, step 1): the Packages file must have the sha256 the signed Release
    lists, and the Release must be signed by a key of the keyring the settings name."""
    import gzip
    import hashlib

    project = _project(tmp_path / "project")
    packages = archive.root / "dists" / "bookworm" / "main" / "binary-amd64" / "Packages.gz"
    signed = hashlib.sha256(packages.read_bytes()).hexdigest()
    # A mirror serves an index with one more package (the signed Release unchanged).
    text = gzip.decompress(packages.read_bytes()).decode()
    packages.write_bytes(gzip.compress((text + "\n" + text.replace("Package: tool", "Package: tool2")).encode()))
    served = hashlib.sha256(packages.read_bytes()).hexdigest()
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 1, done.stderr
    assert "dists/bookworm/main/binary-amd64/Packages.gz: does not match the signed Release" in done.stderr
    assert f"expected sha256 {signed}" in done.stderr and f"got sha256 {served}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (project / "locks" / "images" / "solver.lock.toml").exists()

    # Re-published, but signed by a key the keyring does not hold: refused naming the key
    # expected (the keyring's) and the key found.
    archive.publish()
    archive.release(signer=signers[1])
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 1, done.stderr
    assert "dists/bookworm/InRelease: the signature does not verify against" in done.stderr
    assert str(signers[0].keyring) in done.stderr and signers[0].fingerprint in done.stderr
    assert signers[1].fingerprint[-16:] in done.stderr and "not in the keyring" in done.stderr
    assert "Traceback" not in done.stderr and not (project / "locks" / "images" / "solver.lock.toml").exists()

    # Signed by the right key, but for another suite (an old suite's signed file replayed).
    archive.release(suite="bullseye")
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 1 and "the signed Release is for suite 'bullseye'" in done.stderr, done.stderr

    # The signature checked against the keyring alone: a Release edited after signing (a text
    # outside the signed part) is not what is read.
    archive.release()
    inrelease = archive.root / "dists" / "bookworm" / "InRelease"
    inrelease.write_text(inrelease.read_text().replace("Origin: test", "Origin: forged"))
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 1 and "BAD signature" in done.stderr, done.stderr


def test_an_archive_without_a_keyring_is_refused_unless_the_user_opts_out(tmp_path: Path, archive: DebArchive) -> None:
    project = _project(tmp_path / "project")
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver", trust={})
    assert done.returncode == 2, done.stderr
    assert "Debian archive 'testdeb' names no keyring" in done.stderr and "[debian-archives.testdeb]" in done.stderr
    assert "HARNESS_DEBIAN_KEYRING_TESTDEB" in done.stderr and "allow-unsigned = true" in done.stderr
    assert "Traceback" not in done.stderr and not (project / "locks" / "images" / "solver.lock.toml").exists()
    # A keyring that is not there: named.
    missing = tmp_path / "no-such.gpg"
    done = _harness(
        tmp_path / "h", project, archive, "lock", "image:solver", trust={"HARNESS_DEBIAN_KEYRING_TESTDEB": str(missing)}
    )
    assert done.returncode == 2 and f"the keyring {missing}" in done.stderr and "does not exist" in done.stderr
    # The explicit opt-out, in the user's settings: locked, and the lock says the index was not verified.
    (tmp_path / "h").mkdir(exist_ok=True)
    (tmp_path / "h" / "config.toml").write_text("[debian-archives.testdeb]\nallow-unsigned = true\n")
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver", trust={})
    assert done.returncode == 0, done.stderr
    text = (project / "locks" / "images" / "solver.lock.toml").read_text()
    assert 'release = "not verified (allow-unsigned)"' in text and "signed-by = []" in text
    assert "/dists/bookworm/InRelease" not in archive.requests
    # Once the settings name the keyring, the next lock checks the archive, unasked.
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 0, done.stderr
    text = (project / "locks" / "images" / "solver.lock.toml").read_text()
    assert 'release = "InRelease verified with gpgv"' in text and "/dists/bookworm/InRelease" in archive.requests
    # A bad settings value: named with file and key.
    (tmp_path / "h" / "config.toml").write_text('[debian-archives.testdeb]\nallow-unsigned = "yes"\n')
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver", "--refresh", trust={})
    assert done.returncode == 2 and "config.toml: debian-archives.testdeb.allow-unsigned: expected true or false" in (
        done.stderr
    )


POSTINST = """#!/bin/sh
set -e
mkdir -p /var/lib/tool
echo "$DPKG_MAINTSCRIPT_PACKAGE $DPKG_MAINTSCRIPT_NAME $1 [$2] $DPKG_MAINTSCRIPT_ARCH $SOURCE_DATE_EPOCH $LC_ALL $HOME" \\
    >> /var/lib/tool/configured
[ -f /var/lib/tool/preinst-ran ] && echo "after preinst" >> /var/lib/tool/configured
ln -sf /usr/bin/tool /etc/tool-alternative
chown root:mail /var/lib/tool  # no id but 0 in the namespace: a no-op, as owners are not kept
echo "network: $(cat /proc/net/dev | wc -l) lines, user: $(cat /proc/self/uid_map | wc -l) map" >> /var/lib/tool/configured
"""


def _scripted_archive(archive: DebArchive) -> None:
    shell = host_shell_files()
    if shell is None:
        pytest.skip("no dash on this machine to build a base the scripts can run on")
    archive.add("minbase", "1", shell, executable=tuple(shell))  # the loader too, as libc6 ships it
    archive.add(
        "tool",
        "2.0-1",
        {"usr/bin/tool": "#!/bin/sh\necho tool\n"},
        executable=("usr/bin/tool",),
        depends="minbase",
        preinst='#!/bin/sh\nmkdir -p /var/lib/tool\necho "$1" > /var/lib/tool/preinst-ran\n',
        postinst=POSTINST,
    )
    archive.add("noisy", "1", {"usr/share/noisy": "x\n"}, postinst="#!/bin/sh\necho ran > /noisy-ran\n")
    archive.publish()


def test_maintainer_scripts_of_declared_packages_run_in_a_sandbox_reproducibly(
    tmp_path: Path, archive: DebArchive
) -> None:
    """Issue 33, step 3: the template's ``configure`` packages get ``preinst install`` and
    ``postinst configure`` in a sandbox over the new root (no network, uid 0 of its own user
    namespace, a fixed environment); two empty homes realize the same content; a package not
    declared keeps its scripts unrun, and the manifest says which ran."""
    from harness.realize.maintscripts import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"no sandbox here: {unavailable_reason()}")
    _scripted_archive(archive)
    project = _project(tmp_path / "project", packages='"tool", "noisy"')
    template = project / "harbor" / "images" / "solver.toml"
    template.write_text(template.read_text().replace('assume = ["libc6"]', 'assume = ["libc6"]\nconfigure = ["tool"]'))
    locked = _harness(tmp_path / "h0", project, archive, "lock", "image:solver")
    assert locked.returncode == 0, locked.stderr
    text = (project / "locks" / "images" / "solver.lock.toml").read_text()
    assert 'configure = ["tool"]' in text
    store_name = re.search(r'^store = "(.*)"$', text, re.M).group(1)  # type: ignore[union-attr]
    hashes = []
    for home in (tmp_path / "home-a", tmp_path / "home-b"):
        done = _harness(home, project, archive, "realize", "image:solver")
        assert done.returncode == 0, done.stderr
        hashes.append(_content_hash(home, store_name))
    assert hashes[0] == hashes[1]
    root = tmp_path / "home-a" / "store" / store_name
    lines = (root / "var" / "lib" / "tool" / "configured").read_text().splitlines()
    assert lines[0] == "tool postinst configure [] amd64 315532800 C /root"
    assert lines[1] == "after preinst"
    # No network but loopback (two header lines and lo), one uid mapped.
    assert lines[2] == "network: 3 lines, user: 1 map"
    assert (root / "var" / "lib" / "tool" / "preinst-ran").read_text() == "install\n"
    assert os.readlink(root / "etc" / "tool-alternative") == "../usr/bin/tool"  # made relative
    assert not (root / "noisy-ran").exists()
    for made in ("bin", "lib64", "proc", "dev", "tmp", "run", ".harness-maintscripts"):
        assert not os.path.lexists(root / made), made
    manifest = json.loads((root / ".harness-rootfs.json").read_text())["maintainer_scripts"]
    assert manifest["run"] == ["tool"] and manifest["ran"] == ["tool preinst install", "tool postinst configure"]
    assert manifest["carried"] == {"noisy": ["postinst"]}
    # The scripts are an input of the store name: without `configure`, another path; "*"
    # names every pinned package in the lock.
    template.write_text(template.read_text().replace('configure = ["tool"]\n', ""))
    assert _harness(tmp_path / "h0", project, archive, "lock", "image:solver").returncode == 0
    assert store_name not in (project / "locks" / "images" / "solver.lock.toml").read_text()
    template.write_text(template.read_text().replace('assume = ["libc6"]', 'assume = ["libc6"]\nconfigure = ["*"]'))
    assert _harness(tmp_path / "h0", project, archive, "lock", "image:solver").returncode == 0
    text = (project / "locks" / "images" / "solver.lock.toml").read_text()
    assert 'configure = ["minbase", "noisy", "tool"]' in text


def test_a_failing_script_or_an_unpinned_configure_package_is_refused(tmp_path: Path, archive: DebArchive) -> None:
    from harness.realize.maintscripts import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"no sandbox here: {unavailable_reason()}")
    _scripted_archive(archive)
    archive.add("broken", "1", {"usr/share/b": "b\n"}, depends="minbase", postinst="#!/bin/sh\necho oops >&2\nexit 3\n")
    archive.add("perl-thing", "1", {"usr/share/p": "p\n"}, postinst="#!/usr/bin/perl\nprint 1;\n")
    archive.publish()
    project = _project(tmp_path / "project", packages='"broken", "perl-thing"')
    template = project / "harbor" / "images" / "solver.toml"
    base = template.read_text()
    template.write_text(base.replace('assume = ["libc6"]', 'assume = ["libc6"]\nconfigure = ["tool"]'))
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 2 and "solver.toml: debian.configure: tool is not one of the packages" in done.stderr
    template.write_text(base.replace('assume = ["libc6"]', 'assume = ["libc6"]\nconfigure = ["*", "broken"]'))
    done = _harness(tmp_path / "h", project, archive, "lock", "image:solver")
    assert done.returncode == 2 and 'debian.configure: "*" (every pinned package) stands alone' in done.stderr
    for configure, message in (
        ("broken", "broken's postinst configure failed (exit 3):\noops"),
        ("perl-thing", "perl-thing's postinst runs /usr/bin/perl, which no pinned package provides"),
    ):
        template.write_text(base.replace('assume = ["libc6"]', f'assume = ["libc6"]\nconfigure = ["{configure}"]'))
        assert _harness(tmp_path / "h", project, archive, "lock", "image:solver").returncode == 0
        done = _harness(tmp_path / "h", project, archive, "realize", "image:solver")
        assert done.returncode == 1 and f"template solver: {message}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("hint:") <= 1, done.stderr
        assert not list((tmp_path / "h" / "store").glob("*-rootfs-solver"))


def test_configure_order_puts_dependencies_first() -> None:
    from harness.realize.maintscripts import configure_order

    assert configure_order({"app": {"lib", "libc6"}, "lib": {"base"}, "base": set(), "zz": set()}) == [
        "base",
        "lib",
        "app",
        "zz",
    ]
    assert configure_order({"a": {"b"}, "b": {"a"}}) == ["b", "a"]  # a cycle, broken by name


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


@pytest.fixture
def debian() -> dict[str, str]:
    """The settings of archive ``debian``: this machine's Debian archive (from its apt sources)
    and Debian's keyring; skips where there are none."""
    url = _apt_archive()
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if url is None or not Path("/etc/debian_version").exists():
        pytest.skip("no Debian archive in this machine's apt sources")
    if not keyring.is_file():
        pytest.skip("no Debian archive keyring on this machine (package debian-archive-keyring)")
    return {"HARNESS_DEBIAN_ARCHIVE_DEBIAN": url, "HARNESS_DEBIAN_KEYRING_DEBIAN": str(keyring)}


def _realized_twice(tmp_path: Path, env: dict[str, str], label: str, debian: str) -> tuple[Path, str]:
    """A project whose template ``label`` has the ``[debian]`` table ``debian`` (bookworm, amd64,
    archive ``debian``), locked in one home and realized in two empty others (``ha``, ``hb``)
    to the same content: the root in ``ha`` and its lock's text."""
    project = tmp_path / "project"
    (project / "services").mkdir(parents=True)
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "harbor" / "images" / f"{label}.toml").write_text(
        f'[debian]\narchive = "debian"\nsuite = "bookworm"\narchitecture = "amd64"\n{debian}'
    )
    for home, command in (("h0", "lock"), ("ha", "realize"), ("hb", "realize")):
        done = run_harness_process(
            "--project",
            str(project),
            command,
            f"image:{label}",
            env={**env, "HARNESS_HOME": str(tmp_path / home)},
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
    text = (project / "locks" / "images" / f"{label}.lock.toml").read_text()
    name = re.search(r'^store = "(.*)"$', text, re.M).group(1)  # type: ignore[union-attr]
    assert _content_hash(tmp_path / "ha", name) == _content_hash(tmp_path / "hb", name)
    return tmp_path / "ha" / "store" / name, text


@pytest.mark.network
def test_a_real_debian_package(tmp_path: Path, debian: dict[str, str]) -> None:
    """``hello`` from the machine's Debian archive (bookworm): locked with its closure less libc6,
    realized in two empty homes to the same content; the binary runs against the host's libc."""
    root, text = _realized_twice(tmp_path, debian, "hello", 'packages = ["hello"]\nassume = ["libc6"]\n')
    assert 'name = "hello"' in text and debian["HARNESS_DEBIAN_ARCHIVE_DEBIAN"] not in text
    assert 'release = "InRelease verified with gpgv"' in text and re.search(r'signed-by = \["[0-9A-F]{40}', text)
    out = subprocess.run([f"{root}/usr/bin/hello"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Hello, world!"
    assert sys.platform == "linux"


@pytest.mark.network
def test_a_real_debian_base_with_every_maintainer_script(tmp_path: Path, debian: dict[str, str]) -> None:
    """A bookworm base (base-passwd, base-files, dash, coreutils, sed, grep and their closure) locked with
    ``configure = ["*"]``: every package's preinst/postinst runs in the sandbox, and two empty
    homes realize the same content (issue 33, step 3, with real packages)."""
    from harness.realize.maintscripts import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"no sandbox here: {unavailable_reason()}")
    packages = 'packages = ["base-passwd", "base-files", "dash", "coreutils", "sed", "grep"]\nconfigure = ["*"]\n'
    root, _ = _realized_twice(tmp_path, debian, "base", packages)
    ran = json.loads((root / ".harness-rootfs.json").read_text())["maintainer_scripts"]["ran"]
    assert {"base-passwd postinst configure", "base-files postinst configure"} <= set(ran), ran
    assert (root / "etc" / "passwd").read_text().startswith("root:*:0:0:root:/root:")  # base-passwd's postinst
    assert os.readlink(root / "etc" / "alternatives" / "awk").endswith("usr/bin/gawk")  # update-alternatives


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


def _stanza(name: str, version: str, **fields: str) -> dict[str, str]:
    sha = (name + version).encode().hex().ljust(64, "0")[:64]
    base = {"Package": name, "Version": version, "Filename": f"pool/{name}_{version}.deb", "Size": "1", "SHA256": sha}
    return base | {k.replace("_", "-"): v for k, v in fields.items()}


def test_version_constraints_choose_a_version_that_satisfies_them() -> None:
    """``>=``, ``<<``, ``=`` and an alternative whose first choice fails its constraint: each
    package gets the newest version every constraint on it allows (issue 33, step 2)."""
    from harness.resolve.debian import closure, satisfies

    for version, constraint, expected in [
        ("2.36-9", ">= 2.34", True),
        ("2.33", ">= 2.34", False),
        ("1.9", "<< 2", True),
        ("2.0", "<< 2", False),
        ("2~rc1", "<< 2", True),
        ("1.2-1", "= 1.2-1", True),
        ("1.2-2", "= 1.2-1", False),
        ("3", ">> 2", True),
        ("2", "<= 2", True),
        ("anything", "", True),
    ]:
        assert satisfies(version, constraint) is expected, (version, constraint)
    index = [
        _stanza("app", "1", Depends="libx (<< 2), liby (= 1.0-1), libz (>= 3) | libw"),
        _stanza("libx", "1.5"),
        _stanza("libx", "2.1"),
        _stanza("liby", "1.0-2"),
        _stanza("liby", "1.0-1"),
        _stanza("libz", "2"),
        _stanza("libw", "7"),
    ]
    pins = closure(index, ("app",), (), "t.toml")
    # libx: 2.1 is newer, but << 2 holds only for 1.5; liby: exactly 1.0-1; libz 2 fails >= 3,
    # so the second alternative, libw.
    assert [(p.name, p.version) for p in pins] == [("app", "1"), ("libw", "7"), ("libx", "1.5"), ("liby", "1.0-1")]
    assert pins[2].filename == "pool/libx_1.5.deb"


def test_a_constraint_met_later_chooses_the_package_again() -> None:
    """libx is first wanted unconstrained (newest, 3), then by a package that needs ``<< 3``:
    the walk starts again knowing it, and both dependents get libx 2."""
    from harness.resolve.debian import closure

    index = [
        _stanza("top", "1", Depends="libx, mid"),
        _stanza("mid", "1", Depends="libx (<< 3)"),
        _stanza("libx", "3"),
        _stanza("libx", "2"),
    ]
    pins = closure(index, ("top",), (), "t.toml")
    assert [(p.name, p.version) for p in pins] == [("libx", "2"), ("mid", "1"), ("top", "1")]


def test_unsatisfiable_constraints_name_package_constraint_and_versions() -> None:
    from harness.errors import InputError
    from harness.resolve.debian import closure

    index = [_stanza("app", "1", Depends="libc6 (>= 2.34)"), _stanza("libc6", "2.31-13"), _stanza("libc6", "2.28")]
    with pytest.raises(InputError) as failed:
        closure(index, ("app",), (), "t.toml")
    assert "t.toml: app Depends: libc6 (>= 2.34): the index has 2.31-13, 2.28" in str(failed.value)
    # Assumed (the host's): not checked, not pinned.
    assert [p.name for p in closure(index, ("app",), ("libc6",), "t.toml")] == ["app"]
    # Two dependents whose constraints no one version meets.
    index = [
        _stanza("top", "1", Depends="liba, libb"),
        _stanza("liba", "1", Depends="libx (>= 2)"),
        _stanza("libb", "1", Depends="libx (<< 2)"),
        _stanza("libx", "1"),
        _stanza("libx", "2"),
    ]
    with pytest.raises(InputError) as failed:
        closure(index, ("top",), (), "t.toml")
    assert "libx" in str(failed.value) and "(>= 2)" in str(failed.value) and "(<< 2)" in str(failed.value)
    assert "the index has 2, 1" in str(failed.value)
    # A versioned dependency on a virtual package: only a versioned Provides meets it.
    index = [
        _stanza("app", "1", Depends="awk (>= 1)"),
        _stanza("mawk", "1", Provides="awk"),
        _stanza("gawk", "5", Provides="awk (= 5)"),
    ]
    assert [p.name for p in closure(index, ("app",), (), "t.toml")] == ["app", "gawk"]


def test_release_parsing_signatures_and_expiry_pure() -> None:
    """The pure parts of the InRelease check: the SHA256 list, gpgv's status lines (good,
    bad, unknown key), Valid-Until."""
    from datetime import UTC, datetime

    from harness.resolve.debrelease import ReleaseError, _check_valid_until, parse_release, signed_by

    fields, files = parse_release(
        "Suite: stable\nCodename: bookworm\nMD5Sum:\n 0ed6 12 main/x\nSHA256:\n"
        f" {'a' * 64}  1484322 main/binary-amd64/Packages.xz\n {'b' * 64} 7 main/binary-amd64/Packages\n"
    )
    assert fields["Codename"] == "bookworm"
    assert files == {"main/binary-amd64/Packages.xz": ("a" * 64, 1484322), "main/binary-amd64/Packages": ("b" * 64, 7)}
    status = (
        "[GNUPG:] NEWSIG\n[GNUPG:] GOODSIG 6ED0E7B82643E131 Debian\n"
        "[GNUPG:] VALIDSIG 4CB5 2026-07-11 1783765031 0 4 0 1 8 01 B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8\n"
        "[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG 1234ABCD 1 8 01 1783765032 9 -\n[GNUPG:] NO_PUBKEY 1234ABCD\n"
    )
    good, problems = signed_by(status)
    assert good == ("B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8",)  # the primary key's fingerprint
    assert problems == ["signed by key 1234ABCD, which is not in the keyring"]
    assert signed_by("[GNUPG:] BADSIG 1234ABCD x\n") == ((), ["a BAD signature by key 1234ABCD"])
    now = datetime(2026, 1, 1, tzinfo=UTC)
    _check_valid_until("Sat, 02 Jan 2026 00:00:00 UTC", "r", now)
    _check_valid_until(None, "r", now)
    with pytest.raises(ReleaseError, match="expired on Wed, 31 Dec 2025"):
        _check_valid_until("Wed, 31 Dec 2025 00:00:00 UTC", "r", now)


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


def test_a_packages_index_is_unpacked_within_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Packages index unpacks as its name says, stream after stream; one that unpacks past
    the limit (a small file can unpack to gigabytes), one cut short and one that is not what
    its name says are each an error naming the file, never a machine out of memory."""
    import gzip
    import lzma

    import harness.resolve.debian as debian
    from harness.errors import HarnessError

    text = b"Package: a\nVersion: 1\n\n"
    assert debian.unpacked_index("Packages", text, "w") == text
    assert debian.unpacked_index("Packages.xz", lzma.compress(text) + lzma.compress(text), "w") == text * 2
    assert debian.unpacked_index("Packages.gz", gzip.compress(text), "w") == text
    monkeypatch.setattr(debian, "_MAX_INDEX", 1024)
    bombs = {"Packages.xz": lzma.compress(b"\0" * 4096), "Packages.gz": gzip.compress(b"\0" * 4096)}
    for name, bomb in bombs.items():
        assert len(bomb) < 1024
        with pytest.raises(HarnessError, match=f"^dists/{name}: unpacks to more than 0 MiB"):
            debian.unpacked_index(name, bomb, f"dists/{name}")
        with pytest.raises(HarnessError, match="ends before its end"):
            debian.unpacked_index(
                name, (lzma.compress(text) if name.endswith(".xz") else gzip.compress(text))[:-8], name
            )
        with pytest.raises(HarnessError, match="not a valid compressed index"):
            debian.unpacked_index(name, b"not compressed at all", name)
