"""A home shared by a lab (``harness store init --group``), with two real unprivileged users.

Needs root: it creates two users in one group (``useradd``) and switches to each in a forked
child (setgroups, setgid, setuid), which then runs harness in-process: the store API and the
real CLI entry point. Each child uses a strict umask (077) to show that group access does not
depend on it. Without root (or without ``useradd``) every test here skips, saying so.
"""

from __future__ import annotations

import contextlib
import grp
import io
import json
import os
import pickle
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import pytest

# Everything the children use is imported here, before any fork: a child runs as a user who
# may not be able to read this interpreter's files (CI keeps Python in root's home).
import harness.cli.commands.store
import harness.cli.output
import harness.lock.lockfile
import harness.lock.storepaths
import harness.realize.builder
import harness.resolve.git
import harness.store.gc
import harness.store.shared
import harness.store.verify
from harness.cli import main
from harness.errors import HarnessError
from harness.manifests.model import Source
from harness.store.hashing import content_hash
from harness.store.store import BuildResult, Store, StoreError

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None,
        reason="needs root and useradd: it creates two users in one group (the root run of CI covers it)",
    ),
]

GROUP = "harness-lab-test"
NAMES = ("harness-lab-a", "harness-lab-b")
P1 = "0" * 32 + "-registered-by-a"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def _ensure_users() -> tuple[User, User]:
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    users = []
    for name in NAMES:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", "-G", GROUP, name], check=True)
        entry = pwd.getpwnam(name)
        lab = grp.getgrnam(GROUP).gr_gid
        users.append(User(name, entry.pw_uid, entry.pw_gid, (entry.pw_gid, lab)))
    return users[0], users[1]


@pytest.fixture(scope="module")
def lab() -> tuple[User, User]:
    return _ensure_users()


@pytest.fixture
def home() -> Iterator[Path]:
    # Not under pytest's tmp_path: its folders are 0700 root, which the users cannot enter.
    folder = Path(tempfile.mkdtemp(prefix="harness-shared-"))
    folder.chmod(0o1777)  # like /tmp: the first member creates the home in it
    yield folder / "home"
    shutil.rmtree(folder, ignore_errors=True)


def as_user(user: User, action: Callable[[], Any]) -> Any:
    """Run ``action()`` in a child that is ``user`` (umask 077); return its result, or raise
    AssertionError naming the exception it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.umask(0o077)
            outcome: tuple[str, Any] = ("ok", action())
        except BaseException as exc:  # anything at all: reported to the parent
            outcome = ("raised", (type(exc).__name__, str(exc)))
        with os.fdopen(write_end, "wb") as sink:
            pickle.dump(outcome, sink)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as source:
        data = source.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise AssertionError(f"{user.name}: {value[0]}: {value[1]}")
    return value


def cli(home: Path, *args: str) -> tuple[int, str, str]:
    """The real CLI in-process (call it in a child): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["--home", str(home), *args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def build_tree(out: Path) -> BuildResult:
    (out / "bin").mkdir(parents=True)
    (out / "data.txt").write_text("weights\n")
    (out / "bin" / "run").write_text("#!/bin/sh\n")
    (out / "bin" / "run").chmod(0o755)
    return BuildResult(obtained="test")


def never(out: Path) -> BuildResult:
    raise RuntimeError("built again: the shared path was not reused")


def init_and_add(home: Path) -> list[Any]:
    """As the first member: make the shared home (CLI) and register P1 in it (CLI umask)."""
    code, out, err = cli(home, "store", "init", "--group", GROUP)
    assert code == 0, err
    harness.store.shared.apply_group_umask(home)  # what the CLI does for every command
    Store.in_home(home).add(P1, "weights", build_tree)
    return [code, out]


def test_init_makes_a_group_home_with_a_sticky_store(lab: tuple[User, User], home: Path) -> None:
    a, _ = lab
    as_user(a, lambda: init_and_add(home))
    store = home / "store"
    st = os.stat(store)
    assert st.st_gid == grp.getgrnam(GROUP).gr_gid
    assert st.st_mode & stat.S_ISGID and st.st_mode & stat.S_ISVTX and st.st_mode & 0o070 == 0o070
    for folder in (".meta", ".tmp", ".links"):
        assert os.stat(store / folder).st_mode & stat.S_ISVTX, folder
    assert os.stat(store / ".locks").st_mode & 0o070 == 0o070
    # The registered path: read-only, the lab's group, readable by it despite umask 077.
    path = store / P1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o555
    assert stat.S_IMODE(os.stat(path / "data.txt").st_mode) == 0o444
    assert os.stat(path / "data.txt").st_gid == grp.getgrnam(GROUP).gr_gid
    lock = store / ".locks" / f"{P1}.lock"
    assert stat.S_IMODE(os.stat(lock).st_mode) & 0o060 == 0o060  # group-writable lock file


def test_another_member_reuses_a_path_but_cannot_change_or_remove_it(lab: tuple[User, User], home: Path) -> None:
    a, b = lab
    as_user(a, lambda: init_and_add(home))

    def member_b() -> dict[str, Any]:
        store = Store.in_home(home)
        record = store.add(P1, "weights", never)  # registered by a: used as it is
        findings = harness.store.verify.verify_store(store, check_contents=True)
        refused: dict[str, str] = {}
        try:
            store.delete(P1)
        except StoreError as exc:
            refused["delete"] = exc.message
        for what, attempt in {
            "rename": lambda: os.rename(store.root / P1, store.root / "stolen"),
            "rmtree": lambda: shutil.rmtree(store.root / P1),
            "write": lambda: (store.root / P1 / "data.txt").write_text("changed"),
            "add a file": lambda: (store.root / P1 / "new").write_text("x"),
            "unregister": lambda: store.record_path(P1).unlink(),
            "chmod": lambda: os.chmod(store.root / P1, 0o755),
        }.items():
            try:
                attempt()
                refused[what] = ""
            except PermissionError as exc:
                refused[what] = str(exc)
        code, _, _ = cli(home, "store", "verify", "--repair")
        return {
            "content": record.content,
            "ok": [f.status for f in findings],
            "refused": refused,
            "repair": code,
            "read": (store.root / P1 / "data.txt").read_text(),
        }

    seen = as_user(b, member_b)
    assert seen["read"] == "weights\n" and seen["ok"] == ["ok"]
    assert all(seen["refused"].values()), seen["refused"]
    assert "registered by harness-lab-a" in seen["refused"]["delete"]
    assert "only harness-lab-a (or root)" in seen["refused"]["delete"]
    assert seen["repair"] == 0  # nothing to repair: the path is intact
    assert Store.in_home(home).is_registered(P1)


def test_gc_deletes_only_the_callers_paths(lab: tuple[User, User], home: Path) -> None:
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    p2 = "1" * 32 + "-registered-by-b"

    def member_b() -> list[Any]:
        harness.store.shared.apply_group_umask(home)
        Store.in_home(home).add(p2, "weights", build_tree)
        code, out, err = cli(home, "store", "gc")  # neither path is rooted
        return [code, out, err]

    code, out, err = as_user(b, member_b)
    assert code == 0, err
    store = Store.in_home(home)
    assert f"deleted {p2}" in out and P1 not in out
    assert store.is_registered(P1) and not store.is_registered(p2)
    code, out, err = as_user(a, lambda: cli(home, "store", "gc"))
    assert code == 0 and f"deleted {P1}" in out, err
    assert not store.is_registered(P1)


def test_store_ls_names_who_registered_each_path(lab: tuple[User, User], home: Path) -> None:
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    p2 = "2" * 32 + "-from-b"

    def member_b() -> str:
        harness.store.shared.apply_group_umask(home)
        Store.in_home(home).add(p2, "weights", build_tree)
        code, out, err = cli(home, "store", "ls", "--json")
        assert code == 0, err
        return out

    listed = {entry["name"]: entry["owner"] for entry in json.loads(as_user(b, member_b))}
    assert listed == {P1: "harness-lab-a", p2: "harness-lab-b"}


def test_per_path_locks_work_across_users(lab: tuple[User, User], home: Path) -> None:
    """A lock one member holds excludes the other; the file the first created opens for both."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    name = "3" * 32 + "-contended"
    held_r, held_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # member a holds the lock until told to let go
        try:
            os.setgroups(list(a.groups))
            os.setgid(a.gid)
            os.setuid(a.uid)
            os.umask(0o077)
            with Store.in_home(home).lock(name):
                os.write(held_w, b"1")
                os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(held_r, 1) == b"1"

        def try_lock() -> str:
            try:
                with Store.in_home(home).lock(name).acquire(timeout=0):
                    return "acquired"
            except filelock.Timeout:
                return "excluded"

        assert as_user(b, try_lock) == "excluded"
    finally:
        os.write(go_w, b"1")
        os.waitpid(pid, 0)
    assert as_user(b, try_lock) == "acquired"


def test_leftover_of_another_member_is_refused_clearly(lab: tuple[User, User], home: Path) -> None:
    a, b = lab
    name = "4" * 32 + "-half-built"

    def leave_debris() -> None:
        init_and_add(home)
        (home / "store" / name).mkdir()  # a crash between move and registration

    as_user(a, leave_debris)

    def member_b() -> str:
        try:
            Store.in_home(home).add(name, "weights", build_tree)
        except HarnessError as exc:
            return str(exc)
        return ""

    message = as_user(b, member_b)
    assert "registered by harness-lab-a" in message and "ask harness-lab-a" in message


def test_init_refuses_a_group_the_caller_is_not_in(lab: tuple[User, User], home: Path) -> None:
    a, _ = lab
    code, _, err = as_user(a, lambda: cli(home, "store", "init", "--group", "root"))
    assert code == 2 and "not a member of root" in err
    code, _, err = as_user(a, lambda: cli(home, "store", "init", "--group", "no-such-group-here"))
    assert code == 2 and "no such group" in err


def _make_upstream(upstream: Path) -> None:
    """A repository the lab can read (a shared one, or a colleague's), made by the caller."""
    upstream.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", "a"], ["config", "user.email", "a@lab"]):
        subprocess.run(["git", *args], cwd=upstream, check=True)
    (upstream / "setup.py").write_text("print('hello')\n")
    subprocess.run(["git", "add", "-A"], cwd=upstream, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "first"], cwd=upstream, check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(upstream)], check=True)


def test_a_git_mirror_one_member_made_serves_the_others(lab: tuple[User, User], home: Path) -> None:
    """Member a locks a git source in the shared home, which makes its mirror; member b then
    exports the locked commit from that mirror (as realize does, offline) and locks it again
    offline through it: the mirror is the group's, not only its maker's. And online: b
    fetches from a's repository, which git serves to b only with safe.directory set."""
    a, b = lab
    upstream = home.parent / "upstream"

    def lock_as_a() -> Any:
        init_and_add(home)
        _make_upstream(upstream)
        return harness.resolve.git.lock_source(Source(repo=upstream.as_uri(), rev="main"), home / "cache")

    pin = as_user(a, lock_as_a)
    mirror = harness.resolve.git.mirror_path(home / "cache", pin.repo)
    assert mirror.stat().st_mode & 0o070 == 0o070, oct(mirror.stat().st_mode)

    def use_as_b() -> Any:
        out = home.parent / "exported-by-b"
        harness.resolve.git.export_source(pin, home / "cache", out, offline=True)
        again = harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache", offline=True)
        # Online too: b fetches from a's repository, which git calls "dubious ownership".
        online = harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache")
        return content_hash(out), again.commit, again.tree, online.commit

    assert as_user(b, use_as_b) == (pin.tree, pin.commit, pin.tree, pin.commit)


def test_a_mirror_a_member_made_before_it_was_shared_is_refused_by_name_until_opened(
    lab: tuple[User, User], home: Path
) -> None:
    """A mirror left 0700 by an older harness (or made before the home was shared) is its
    maker's alone: another member gets an error naming the maker and the command that opens
    it, not git's "permission denied"; once the maker runs ``store init --group`` again, the
    other member locks through it."""
    a, b = lab
    upstream = home.parent / "upstream"

    def lock_as_a_and_close() -> Any:
        init_and_add(home)
        _make_upstream(upstream)
        pin = harness.resolve.git.lock_source(Source(repo=upstream.as_uri(), rev="main"), home / "cache")
        mirror = harness.resolve.git.mirror_path(home / "cache", pin.repo)
        subprocess.run(["chmod", "-R", "go-rwx", str(mirror)], check=True)  # as mirrors were made before
        return pin

    pin = as_user(a, lock_as_a_and_close)

    def lock_as_b() -> Any:
        try:
            return harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache").commit
        except HarnessError as exc:
            return f"{exc.message} | {exc.hint}"

    refused = as_user(b, lock_as_b)
    assert f"is {a.name}'s and closed to you" in refused and "store init --group" in refused, refused
    assert as_user(a, lambda: cli(home, "store", "init", "--group", GROUP)[0]) == 0
    assert as_user(b, lock_as_b) == pin.commit
