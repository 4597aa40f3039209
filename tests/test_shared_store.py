"""A home shared by a lab (``harness store init --group``), with two real unprivileged users.

Needs root: it creates two users in one group (``useradd``) and switches to each in a forked
child (setgroups, setgid, setuid), which then runs harness in-process: the store API and the
real CLI entry point. Each child uses a strict umask (077) to show that group access does not
depend on it. Without root (or without ``useradd``) every test here skips, saying so.
"""

from __future__ import annotations

import _strptime  # noqa: F401  (time.strptime, in the children: `runs prune`)
import colorsys  # noqa: F401  (rich, for `store ls` tables in the children)
import contextlib
import hashlib
import grp
import io
import json
import os
import pickle
import posixpath
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import filelock
import psutil
import pytest

# Everything the children use is imported here, before any fork: a child runs as a user who
# may not be able to read this interpreter's files (CI keeps Python in root's home).
import harness.cli.commands.store
import harness.cli.output
import harness.lock.lockfile
import harness.lock.stamp
import harness.lock.storepaths
import harness.realize.builder
import harness.resolve.git
import harness.lock.objects
import harness.realize.members
import harness.realize.repair
import harness.realize.unreachable
import harness.store.bytecode
import harness.store.entries
import harness.store.gc
import harness.store.launchcheck
import harness.store.shared
import harness.store.standins
import harness.store.statfile
import harness.store.trust
import harness.store.verify
import harness.config
import harness.download
import harness.lock.images
import harness.manifests.project
import harness.realize.debcache
import harness.realize.install
import harness.realize.rootfs
import harness.realize.standin
import harness.resolve.pins
import harness.resolve.indexpages
import harness.resolve.python
import harness.resolve.sdists
import harness.runs.livelog
import harness.runs.prune
import harness.runs.record
import harness.runs.run
import harness.cli.commands.runs
import harness.store.roots
import packaging.utils  # noqa: F401  (chosen_file, in the children)
from harness.cli import main
from harness.errors import HarnessError
from harness.manifests.model import Source
from harness.runtime.broker import write_token
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


def start_as_user(user: User, action: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``action()`` in a child that is ``user`` (umask 077); return the function that
    waits for its result, or raises AssertionError naming the exception it raised."""
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

    def finish() -> Any:
        with os.fdopen(read_end, "rb") as source:
            data = source.read()
        os.waitpid(pid, 0)
        kind, value = pickle.loads(data)
        if kind == "raised":
            raise AssertionError(f"{user.name}: {value[0]}: {value[1]}")
        return value

    return finish


def as_user(user: User, action: Callable[[], Any]) -> Any:
    """Run ``action()`` in a child that is ``user`` (umask 077); return its result, or raise
    AssertionError naming the exception it raised."""
    return start_as_user(user, action)()


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


def _refusals(attempts: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Try each attempt of another member: what the system refused (its PermissionError), or
    "" for one that went through."""
    refused: dict[str, str] = {}
    for what, attempt in attempts.items():
        try:
            attempt()
            refused[what] = ""
        except PermissionError as exc:
            refused[what] = str(exc)
    return refused


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
        refused.update(
            _refusals(
                {
                    "rename": lambda: os.rename(store.root / P1, store.root / "stolen"),
                    "rmtree": lambda: shutil.rmtree(store.root / P1),
                    "write": lambda: (store.root / P1 / "data.txt").write_text("changed"),
                    "add a file": lambda: (store.root / P1 / "new").write_text("x"),
                    "unregister": lambda: store.record_path(P1).unlink(),
                    "chmod": lambda: os.chmod(store.root / P1, 0o755),
                }
            )
        )
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


def test_each_member_locks_git_sources_through_mirrors_of_their_own(lab: tuple[User, User], home: Path) -> None:
    """Member a locks a git source in the shared home; the mirror is a's own (in a's 0700
    ``cache/git-<uid>``), so member b offline finds no mirror of b's (the lock says so), and
    b's online lock makes b's own, pinning the same commit and files, which b then locks and
    exports offline. b fetches from a's repository, which git serves to b only with
    safe.directory set."""
    a, b = lab
    upstream = home.parent / "upstream"

    def lock_as_a() -> Any:
        init_and_add(home)
        _make_upstream(upstream)
        return harness.resolve.git.lock_source(Source(repo=upstream.as_uri(), rev="main"), home / "cache")

    pin = as_user(a, lock_as_a)
    ours = harness.resolve.git.mirror_path(home.parent / "elsewhere" / "cache", pin.repo)  # only its name
    folder = home / "cache" / f"git-{a.uid}"
    assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == a.uid
    assert (folder / ours.name).is_dir()

    def use_as_b() -> Any:
        try:
            harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache", offline=True)
            refused = ""
        except HarnessError as exc:
            refused = exc.message
        online = harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache")
        again = harness.resolve.git.lock_source(Source(repo=pin.repo, rev="main"), home / "cache", offline=True)
        out = home.parent / "exported-by-b"
        harness.resolve.git.export_source(pin, home / "cache", out, offline=True)
        return refused, online.commit, online.tree, again.commit, content_hash(out)

    refused, online, tree, again, exported = as_user(b, use_as_b)
    assert "has no local mirror to work offline from" in refused, refused
    assert (online, tree, again, exported) == (pin.commit, pin.tree, pin.commit, pin.tree)
    assert (home / "cache" / f"git-{b.uid}" / ours.name).is_dir()


# --- attacks of one member on another (issue 29) -------------------------------------------------

EVIL = "5" * 32 + "-kinematics-code"


def _plant_registration(home: Path) -> str:
    """As member b: register EVIL (a path and its record, as harness writes them) with b's bytes."""
    harness.store.shared.apply_group_umask(home)

    def payload(out: Path) -> BuildResult:
        out.mkdir()
        (out / "main.py").write_text("print('b was here')\n")
        return BuildResult(obtained="b")

    return Store.in_home(home).add(EVIL, "source", payload).content


def test_a_path_another_member_registered_is_not_used_until_trusted(lab: tuple[User, User], home: Path) -> None:
    """Member b registers a path under a name a's lock names, with bytes of b's: a does not
    use it (not registered for a, refused by name at realize and at launch), until the store's
    owner (a) trusts b. b, for whom a is the store's owner, uses a's paths throughout."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    as_user(b, lambda: _plant_registration(home))

    def member_a() -> dict[str, Any]:
        from harness.store.launchcheck import IntegrityError, check_closure

        store = Store.in_home(home)
        seen: dict[str, Any] = {"registered": store.is_registered(EVIL), "record": store.record(EVIL)}

        def own_build(out: Path) -> BuildResult:  # what a's own lock builds under that name
            out.mkdir()
            (out / "main.py").write_text("print('the real code')\n")
            return BuildResult(obtained="a")

        try:
            store.add(EVIL, "source", own_build)
        except StoreError as exc:
            seen["add"] = f"{exc.message} {exc.hint}"
        try:
            check_closure(store.root, [EVIL])
        except IntegrityError as exc:
            seen["launch"] = exc.message
        code, out, err = cli(home, "store", "verify")
        seen["verify"] = (code, out)
        code, out, err = cli(home, "store", "ls", "--json")
        seen["ls"] = {e["name"]: (e["owner"], e["trusted"]) for e in json.loads(out)}
        seen["trust"] = cli(home, "store", "trust", NAMES[1])
        seen["after"] = Store.in_home(home).is_registered(EVIL)
        return seen

    seen = as_user(a, member_a)
    assert seen["registered"] is False and seen["record"] is None
    assert "registered by harness-lab-b, is not what this user builds for it" in seen["add"], seen
    assert "harness store trust harness-lab-b" in seen["add"]
    assert "harness-lab-b, whom you do not trust" in seen["launch"] and "nothing was launched" not in seen["add"]
    code, out = seen["verify"]
    assert code == 0 and f"ignored   {EVIL}: registered by harness-lab-b" in out, out
    assert seen["ls"] == {P1: ("harness-lab-a", True), EVIL: ("harness-lab-b", False)}
    assert seen["trust"][0] == 0 and seen["after"] is True, seen["trust"]
    # b is not the store's owner: b cannot change whom the store trusts.
    code, _, err = as_user(b, lambda: cli(home, "store", "trust", NAMES[1]))
    assert code == 1 and "only the store's owner (harness-lab-a)" in err
    # b trusts a (the store's owner) throughout.
    assert as_user(b, lambda: Store.in_home(home).is_registered(P1)) is True


def test_what_a_member_plants_in_the_store_fails_nothing_for_the_others(lab: tuple[User, User], home: Path) -> None:
    """b plants a symlink to /etc as a record, a fifo as a record, a symlink as a's next lock
    file and as a project root: a's ls, verify and gc go on (naming the entries), a's add of
    that name is refused naming b (never an OSError, never a write through the link), and b
    cannot delete a's lock file."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    as_user(a, lambda: Store.in_home(home).lock(P1).acquire(timeout=0).lock.release())  # a's lock file
    target = "6" * 32 + "-next"
    victim = home.parent / "victim.txt"

    def plant() -> None:
        store = home / "store"
        (store / ".meta" / "zz.json").symlink_to("/etc")
        os.mkfifo(store / ".meta" / "yy.json")
        (store / ".locks" / f"{target}.lock").symlink_to(victim)
        (store / ".roots" / "projects" / ("0" * 32 + ".json")).symlink_to("/dev/zero")

    victim.write_text("a's file\n")
    victim.chmod(0o666)
    as_user(b, plant)

    def member_a() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for args in (("store", "ls"), ("store", "verify"), ("store", "gc", "--dry-run"), ("store", "gc")):
            seen[" ".join(args)] = cli(home, *args)
        try:
            Store.in_home(home).add(target, "weights", build_tree)
        except HarnessError as exc:
            seen["add"] = str(exc)
        return seen

    seen = as_user(a, member_a)
    for command in ("store ls", "store verify", "store gc --dry-run", "store gc"):
        code, out, err = seen[command]
        assert code == 0 and "internal error" not in err and "Traceback" not in err, (command, out, err)
    assert "zz.json: a symlink made by harness-lab-b" in seen["store ls"][2]
    assert "ignored" in seen["store verify"][1] and "yy.json" in seen["store verify"][1], seen["store verify"]
    assert "a symlink made by harness-lab-b" in seen["add"], seen["add"]
    assert victim.read_text() == "a's file\n", "nothing was written through the planted link"
    assert f"deleted {P1}" in seen["store gc"][1], seen["store gc"]  # a's own unrooted path, as ever

    # a's own lock files are a's: b cannot delete or replace them (.locks is sticky).
    def delete_lock() -> str:
        try:
            (home / "store" / ".locks" / f"{P1}.lock").unlink()
        except PermissionError as exc:
            return str(exc)
        return ""

    assert as_user(b, delete_lock)


def _toy_lock(data: bytes) -> Any:
    """The repository's kinematics lock with one package, one wheel of ``data``'s bytes."""
    from harness.lock.document import LockedFile
    from harness.lock.storepaths import file_path
    from tests.conftest import REPO

    lock = harness.lock.lockfile.read(REPO / "locks" / "kinematics.lock.toml")
    wheel = LockedFile(file="toy-1.0-py3-none-any.whl", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    wheel = wheel.model_copy(update={"store": file_path(wheel)})
    package = lock.packages[0].model_copy(update={"name": "toy", "wheels": [wheel], "sdist": None})
    return lock.model_copy(update={"packages": [package], "build_packages": [], "weights": [], "sources": []})


def _register_file(home: Path, name: str, file: str, data: bytes) -> None:
    harness.store.shared.apply_group_umask(home)

    def build(out: Path) -> BuildResult:
        out.mkdir()
        (out / file).write_bytes(data)
        return BuildResult(obtained="b")

    Store.in_home(home).add(name, "file", build)


def test_a_wheel_another_member_registered_is_used_once_it_checks_out(lab: tuple[User, User], home: Path) -> None:
    """Fixed-output paths need no trust: a checks b's wheel against the lock's sha256 once,
    vouches for it and uses it; a wheel of other bytes under the lock's name is refused naming
    b and both hashes; and when b re-registers other content, a's check no longer holds."""
    a, b = lab
    good = b"a wheel's bytes\n" * 100
    lock = _toy_lock(good)
    [wheel] = lock.packages[0].wheels
    as_user(a, lambda: init_and_add(home))
    as_user(b, lambda: _register_file(home, wheel.store, wheel.file, good))

    def member_a() -> dict[str, Any]:
        store = Store.in_home(home)
        seen: dict[str, Any] = {"before": store.is_registered(wheel.store)}
        seen["vouched"] = harness.realize.members.check_members_paths(store, [lock])
        seen["after"] = Store.in_home(home).is_registered(wheel.store)
        seen["again"] = harness.realize.members.check_members_paths(Store.in_home(home), [lock])
        return seen

    seen = as_user(a, member_a)
    assert seen == {"before": False, "vouched": [wheel.store], "after": True, "again": []}, seen

    # b replaces the path (b's own) with other bytes under the same name.
    def replace() -> None:
        store = Store.in_home(home)
        store.delete(wheel.store)
        _register_file(home, wheel.store, wheel.file, b"other bytes\n")

    as_user(b, replace)

    def member_a_again() -> dict[str, Any]:
        store = Store.in_home(home)
        seen: dict[str, Any] = {"registered": store.is_registered(wheel.store)}
        try:
            harness.realize.members.check_members_paths(store, [lock])
        except StoreError as exc:
            seen["refused"] = exc.message
        return seen

    seen = as_user(a, member_a_again)
    assert seen["registered"] is False
    assert "registered by harness-lab-b" in seen["refused"] and wheel.file in seen["refused"], seen
    assert f"expected sha256 {wheel.sha256}, found a file of 12 bytes" in seen["refused"]


def test_a_planted_note_folder_costs_a_check_not_the_realize(lab: tuple[User, User], home: Path) -> None:
    """b plants a file where a's folder of checked paths goes: a's check still passes and the
    path is used in that command (said in a warning), and the next command checks again."""
    a, b = lab
    good = b"bytes of a wheel\n" * 10
    lock = _toy_lock(good)
    [wheel] = lock.packages[0].wheels
    as_user(a, lambda: init_and_add(home))
    as_user(b, lambda: _register_file(home, wheel.store, wheel.file, good))
    a_uid = a.uid

    def plant() -> None:
        folder = home / "store" / harness.store.trust.VOUCHED_DIR
        folder.mkdir(exist_ok=True)
        (folder / str(a_uid)).write_text("in the way\n")

    as_user(b, plant)

    def member_a() -> list[Any]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            vouched = harness.realize.members.check_members_paths(Store.in_home(home), [lock])
        return [vouched, Store.in_home(home).is_registered(wheel.store), err.getvalue()]

    vouched, registered, err = as_user(a, member_a)
    assert vouched == [wheel.store] and registered is True
    assert "cannot note that" in err and "checked again next time" in err
    assert as_user(a, lambda: Store.in_home(home).is_registered(wheel.store)) is False  # a new process


def test_a_path_another_member_built_is_used_when_this_users_build_is_the_same(
    lab: tuple[User, User], home: Path
) -> None:
    """Derived paths need no trust either when this user's own build gives the same bytes:
    a builds the path b registered, finds it identical, uses b's (vouched: the next use
    builds nothing); nothing of a's is registered in its place."""
    a, b = lab
    name = "7" * 32 + "-same-env"
    as_user(a, lambda: init_and_add(home))

    def member_b() -> str:
        harness.store.shared.apply_group_umask(home)
        return Store.in_home(home).add(name, "environment", build_tree).content

    theirs = as_user(b, member_b)

    def member_a() -> list[Any]:
        store = Store.in_home(home)
        record = store.add(name, "environment", build_tree)
        again = Store.in_home(home).add(name, "environment", never)  # vouched: not built again
        return [record.content, again.content, Store.in_home(home).is_registered(name)]

    content, again, registered = as_user(a, member_a)
    assert content == again == theirs and registered is True
    assert os.stat(home / "store" / name).st_uid == b.uid  # b's path, used as it is


def test_another_members_download_notes_make_no_one_skip_a_download(lab: tuple[User, User], home: Path) -> None:
    """Issue 30, step 1, in a shared home: a failed interpreter download is remembered per
    user (harness/realize/unreachable.py). b's own note, a note b writes under a's name, and a
    link b puts in place of a's note all leave a asking uv; a's own note still counts."""
    a, b = lab
    unreachable = harness.realize.unreachable
    key = unreachable.download_key("m" * 32 + "-cpython-3.11.7", {})
    cache = home / "cache"
    a_uid = a.uid
    as_user(a, lambda: init_and_add(home))

    def member(action: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            harness.store.shared.apply_group_umask(home)  # what the CLI does for every command
            return action()

        return run

    def b_fails_and_plants() -> list[Any]:
        unreachable.remember_unreachable(cache, key, "uv could not install it (b)")
        seen = unreachable.remembered(cache, key, minutes=60)
        [own] = (cache / unreachable.FOLDER).glob(f"{key}-*.json")
        # A note of b's, under a's name: same key, a time of now.
        (own.parent / f"{key}-{a_uid}.json").write_bytes(own.read_bytes())
        return [seen is not None]

    assert as_user(b, member(b_fails_and_plants)) == [True]
    assert as_user(a, lambda: unreachable.remembered(cache, key, minutes=60)) is None

    def a_fails() -> list[Any]:
        unreachable.remember_unreachable(cache, key, "uv could not install it (a)")  # replaces b's plant
        known = unreachable.remembered(cache, key, minutes=60)
        return [None if known is None else known.reason]

    assert as_user(a, member(a_fails)) == ["uv could not install it (a)"]

    def b_links_a_note_to_its_own() -> None:
        folder = cache / unreachable.FOLDER
        theirs = folder / f"{key}-{a_uid}.json"
        theirs.unlink()  # the folder is the group's, not sticky: b can remove a's note
        theirs.symlink_to(folder / f"{key}-{os.getuid()}.json")

    as_user(b, member(b_links_a_note_to_its_own))
    assert as_user(a, lambda: unreachable.remembered(cache, key, minutes=60)) is None
    # b's own note still counts for b, and only for b.
    assert as_user(b, lambda: unreachable.remembered(cache, key, minutes=60) is not None) is True


# --- rootfs templates, their .deb downloads and the no-op stamps (the last wave's pieces) ---------

TEMPLATE = """\
summary = "a root the members share"

[debian]
archive = "testdeb"
suite = "bookworm"
architecture = "amd64"
packages = ["tool"]
"""


@dataclass(frozen=True)
class Template:
    project: Path  # readable by both members
    lock: Any  # harness.lock.images.TemplateLock
    archive: Any  # tests.debarchive.DebArchive
    content: str  # the content hash of the template's root, realized by root in a private home


@pytest.fixture
def template(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Template]:
    """A template of one package from an (unsigned) archive on loopback, locked and realized by
    root in a private home: the content every member must end up with."""
    from tests.conftest import run_harness_process
    from tests.debarchive import DebArchive

    archive = DebArchive(tmp_path / "archive")
    archive.add("tool", "1.0-1", {"usr/bin/tool": "#!/bin/sh\necho tool\n" + "#" * 4000}, executable=("usr/bin/tool",))
    archive.publish()
    monkeypatch.setenv("HARNESS_DEBIAN_ARCHIVE_TESTDEB", archive.serve())  # the members' children inherit it
    monkeypatch.setenv("HARNESS_DEBIAN_UNSIGNED_TESTDEB", "1")
    project = home.parent / "project"
    (project / "harbor" / "images").mkdir(parents=True)
    (project / "services").mkdir()
    (project / "harbor" / "images" / "solver.toml").write_text(TEMPLATE)
    private = tmp_path / "root-home"
    for args in (("lock", "image:solver"), ("realize", "image:solver")):
        done = run_harness_process("--project", str(project), "--home", str(private), *args)
        assert done.returncode == 0, done.stderr
    lock = harness.lock.images.read(project, "solver")
    content = Store.in_home(private).record(lock.store).content  # type: ignore[union-attr]
    try:
        yield Template(project, lock, archive, content)
    finally:
        archive.close()


def _realize_template(home: Path, project: Path) -> str:
    """As a member: realize the template (in-process, the CLI's umask); its content hash."""
    harness.store.shared.apply_group_umask(home)
    harness.realize.rootfs.realize_templates(home, project, ["solver"])
    record = Store.in_home(home).record(harness.lock.images.read(project, "solver").store)
    assert record is not None
    return record.content


def test_a_template_root_another_member_registered_is_never_used(
    lab: tuple[User, User], home: Path, template: Template
) -> None:
    """b registers the store path a's template lock names, with b's bytes: a's realize builds
    its own, finds other bytes and refuses naming b; nothing of b's is used. Once b removes
    it, a's realize registers the lock's root, the content root realized elsewhere."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    name = template.lock.store

    def plant() -> None:
        harness.store.shared.apply_group_umask(home)

        def payload(out: Path) -> BuildResult:
            (out / "usr" / "bin").mkdir(parents=True)
            (out / "usr" / "bin" / "tool").write_text("#!/bin/sh\necho b was here\n")
            return BuildResult(obtained="b")

        Store.in_home(home).add(name, "rootfs", payload)

    as_user(b, plant)

    def member_a() -> dict[str, Any]:
        seen: dict[str, Any] = {"record": Store.in_home(home).record(name)}
        try:
            _realize_template(home, template.project)
        except HarnessError as exc:
            seen["refused"] = f"{exc.message} {exc.hint}"
        seen["cli"] = cli(home, "--project", str(template.project), "realize", "image:solver")
        return seen

    seen = as_user(a, member_a)
    assert seen["record"] is None, "b's root is not registered for a"
    assert "registered by harness-lab-b, is not what this user builds for it" in seen["refused"], seen
    code, out, err = seen["cli"]
    assert code != 0 and "harness-lab-b" in err and "Traceback" not in err and "internal error" not in err, err
    as_user(b, lambda: Store.in_home(home).delete(name))
    assert as_user(a, lambda: _realize_template(home, template.project)) == template.content
    assert os.stat(home / "store" / name).st_uid == a.uid


def test_what_a_member_plants_among_the_deb_downloads_is_never_unpacked_or_followed(
    lab: tuple[User, User], home: Path, template: Template
) -> None:
    """b plants, under the names a's download of the template's .deb takes in the group's
    cache/debs: a .deb of the right size and other bytes, a symlink as its partial file
    (pointing at a file of a's), a fifo as its lock file. a's realize downloads the real
    .deb and builds the root realized elsewhere; nothing is written through the link and
    nothing hangs on the fifo. Then b makes the folder a link to one of b's: a's next
    realize (with the download gone) uses a folder of a's own."""
    a, b = lab
    [pin] = template.lock.packages
    as_user(a, lambda: init_and_add(home))
    debs = home / "cache" / "debs"
    victim = home.parent / "victim.txt"
    victim.write_text("a's file\n")
    os.chown(victim, a.uid, a.gid)
    victim.chmod(0o600)

    def plant() -> None:
        harness.store.shared.apply_group_umask(home)
        debs.mkdir(parents=True)
        (debs / f"{pin.sha256}.deb").write_bytes(b"!" * pin.size)  # the size the lock says, b's bytes
        (debs / f"{pin.sha256}.deb.part").symlink_to(victim)
        os.mkfifo(debs / f"{pin.sha256}.lock")

    as_user(b, plant)
    fetched = len([r for r in template.archive.requests if r.endswith(".deb")])
    assert as_user(a, lambda: _realize_template(home, template.project)) == template.content
    assert len([r for r in template.archive.requests if r.endswith(".deb")]) == fetched + 1, "downloaded anew"
    assert victim.read_text() == "a's file\n", "nothing was written through the planted link"
    assert hashlib.sha256((debs / f"{pin.sha256}.deb").read_bytes()).hexdigest() == pin.sha256
    assert stat.S_ISREG(os.lstat(debs / f"{pin.sha256}.lock").st_mode)

    # b replaces the shared folder with a link to a folder of b's: a passes it by.
    theirs = home.parent / "b-debs"

    def relink() -> None:
        theirs.mkdir()
        shutil.rmtree(debs)
        debs.symlink_to(theirs)

    as_user(b, relink)
    as_user(a, lambda: Store.in_home(home).delete(template.lock.store))
    assert as_user(a, lambda: _realize_template(home, template.project)) == template.content
    assert list(theirs.iterdir()) == [], "nothing of a's went into b's folder"
    own = home / "cache" / f"debs-{a.uid}"
    assert (own / f"{pin.sha256}.deb").is_file() and os.stat(own).st_mode & 0o777 == 0o700


def _race(
    lab: tuple[User, User],
    after: tuple[Any, str],
    a_action: Callable[[], Any],
    b_action: Callable[[], None],
    folder: Path,
) -> Any:
    """Run ``a_action`` as member a, paused in a's process right after the function ``after``
    (module, name) returns while ``b_action`` runs as member b; a's result."""
    a, b = lab
    paused, go = folder / "paused", folder / "go"

    def wait_for(marker: Path) -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def member_a() -> Any:
        module, name = after
        original = getattr(module, name)

        def then_pause(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            paused.touch()
            wait_for(go)
            return out

        setattr(module, name, then_pause)
        return a_action()

    finish = start_as_user(a, member_a)
    try:
        wait_for(paused)
        as_user(b, b_action)
    finally:
        go.touch()
    return finish()


def test_a_deb_another_member_changes_after_the_download_was_checked_is_refused(
    lab: tuple[User, User], home: Path, template: Template
) -> None:
    """The downloads of a shared home are group-writable: b overwrites a's checked .deb in
    place between a's download and a's unpacking. a's build reads the bytes once and checks
    them again: refused naming the file and both hashes, nothing registered."""
    a, b = lab
    [pin] = template.lock.packages
    as_user(a, lambda: init_and_add(home))
    deb = home / "cache" / "debs" / f"{pin.sha256}.deb"

    def member_a() -> str:
        try:
            _realize_template(home, template.project)
        except HarnessError as exc:
            return f"{exc.message} {exc.hint}"
        return "built"

    def overwrite() -> None:
        with open(deb, "r+b") as handle:  # group-writable: a's file, changed in place
            handle.seek(100)
            handle.write(b"b was here")

    refused = _race(lab, (harness.realize.rootfs, "_fetch"), member_a, overwrite, home.parent)
    assert "changed after it was checked" in refused and str(deb) in refused, refused
    assert pin.sha256 in refused and "nothing was built from it" in refused
    assert as_user(a, lambda: Store.in_home(home).record(template.lock.store)) is None


def _kinematics_project(root: Path) -> harness.manifests.project.Project:
    """The repository's kinematics manifest and lock in a project both members read."""
    from tests.conftest import REPO

    for folder in ("services", "locks"):
        (root / folder).mkdir(parents=True)
    shutil.copy(REPO / "services" / "kinematics.toml", root / "services")
    shutil.copy(REPO / "locks" / "kinematics.lock.toml", root / "locks")
    shutil.copytree(REPO / "services" / "assets" / "arm7", root / "services" / "assets" / "arm7")
    time.sleep(2.1)  # weights changed within two seconds get no stamp (harness/realize/install.py)
    return harness.manifests.project.Project(root)


def test_uvs_cache_is_each_members_own_in_a_shared_home(lab: tuple[User, User], home: Path) -> None:
    """uv's cache holds the unpacked wheels an environment's files are hard links of: in a
    shared home it would be the group's to change, and a file b changed there would be
    installed into a's next environment. uv is given a's own folder instead (`cache/uv-<uid>`,
    0700; a fresh one where b made that name first): a real `uv pip install` through
    `run_uv` unpacks there, not into the group's `cache/`, and b can neither read nor change
    it."""
    from harness.resolve.uvtool import run_uv
    from tests.localindex import wheel_bytes

    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3, an interpreter both members can run, to install into")
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    as_user(b, lambda: (home / "cache" / f"uv-{a.uid}").mkdir(mode=0o777))  # b takes a's name first
    wheel = home.parent / "alpha-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("alpha", "1.0"))
    wheel.chmod(0o644)

    def member_a() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        target = home.parent / f"target-{os.getpid()}"
        run_uv(
            ["pip", "install", "--target", target, "--offline", "--no-index", "--python", "/usr/bin/python3", wheel],
            cache_dir=home / "cache",
        )
        own = harness.store.shared.uv_cache(home / "cache")
        unpacked = sorted(str(p.relative_to(own)) for p in own.glob("archive-v0/*/alpha/__init__.py"))
        return {"own": str(own), "mode": os.stat(own).st_mode & 0o777, "unpacked": unpacked}

    seen = as_user(a, member_a)
    own = Path(seen["own"])
    assert own.parent == home / "cache" and own.name.startswith(f"uv-{a.uid}-"), own
    assert seen["mode"] == 0o700 and len(seen["unpacked"]) == 1, seen
    assert not (home / "cache" / "archive-v0").exists() and list((home / "cache" / f"uv-{a.uid}").iterdir()) == []
    planted = own / seen["unpacked"][0]

    def member_b() -> dict[str, str]:
        harness.store.shared.apply_group_umask(home)
        return _refusals(
            {
                "read a's cache": lambda: list(own.iterdir()),
                "change an unpacked file": lambda: planted.write_text("import os  # b's\n"),
            }
        )

    refused = as_user(b, member_b)
    assert all(refused.values()), refused
    assert as_user(a, lambda: str(harness.store.shared.uv_cache(home / "cache"))) == str(own), "found again"


def test_another_members_answers_of_uv_are_passed_by(lab: tuple[User, User], home: Path) -> None:
    """harness keeps two of uv's answers per uv binary in the home: its version, which every
    run record names, and its interpreter downloads, which locks pin from. In the group's
    `cache/` b could write the version a's run records say a ran with. Each member keeps them
    in its own uv folder: b's planted version is passed by, and a's own answer is read next
    time (no uv started)."""
    from harness.resolve import uvtool

    a, b = lab
    as_user(a, lambda: init_and_add(home))
    real = uvtool.uv_version.__wrapped__(None)  # asked of uv itself
    binary = uvtool.uv_bin()
    st = os.stat(binary)
    key = [binary, st.st_ino, st.st_size, st.st_mtime_ns]

    def member_b() -> None:
        harness.store.shared.apply_group_umask(home)
        for folder in (home / "cache", home / "cache" / f"uv-{a.uid}"):  # the group's, and a's name taken first
            folder.mkdir(mode=0o777, exist_ok=True)
            (folder / "uv-version.json").write_text(json.dumps({"binary": key, "version": "6.6.6"}))
            (folder / "uv-version.json").chmod(0o666)

    as_user(b, member_b)

    def member_a() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        uvtool.uv_version.cache_clear()
        first = uvtool.uv_version(home / "cache")
        asked: list[object] = []
        real_run = uvtool.run_uv
        uvtool.run_uv = lambda *args, **kwargs: asked.append(args) or real_run(*args, **kwargs)  # type: ignore[assignment]
        uvtool.uv_version.cache_clear()
        second = uvtool.uv_version(home / "cache")
        own = harness.store.shared.uv_cache(home / "cache")
        listing = uvtool.downloads_list_file(home / "cache", "linux-x86_64-gnu")
        return {"first": first, "second": second, "asked": len(asked), "own": str(own), "listing": str(listing)}

    seen = as_user(a, member_a)
    assert (seen["first"], seen["second"], seen["asked"]) == (real, real, 0), seen
    own = Path(seen["own"])
    assert own.name.startswith(f"uv-{a.uid}-") and Path(seen["listing"]).is_relative_to(own), seen
    assert json.loads((own / "uv-version.json").read_text())["version"] == real


def test_another_members_up_to_date_stamp_decides_nothing(lab: tuple[User, User], home: Path) -> None:
    """The no-op realize's stamps (cache/up-to-date, sticky) are each user's own: b realizing
    the same project with a variant forced leaves a's stamp alone; b cannot replace a's stamp,
    and a stamp b makes under its name first, one that names P1 as the lock's environment
    (every path in it registered for a), does not make a's realize report "up to date" with
    b's choice; nor does a link or a fifo in its place hang or fail it."""
    a, b = lab
    project = _kinematics_project(home.parent / "kproject")
    as_user(a, lambda: init_and_add(home))
    names = ["kinematics"]

    def stamp(*, remember: bool) -> list[Any]:
        from harness.realize.builder import Report

        harness.store.shared.apply_group_umask(home)
        made = harness.realize.install._Stamp(home, project, names)
        if remember:
            lock = harness.lock.lockfile.read(project.locks_dir / "kinematics.lock.toml")
            made.remember([Report("kinematics", lock.environment.store)])
        return [made.file.name, made.reports()]

    [a_file, reports] = as_user(a, lambda: stamp(remember=True))
    stamps = home / "cache" / "up-to-date"
    assert reports is None and (stamps / a_file).is_file(), "a's stamp; the lock is not realized"
    before = (stamps / a_file).read_bytes()

    def b_forces_a_variant() -> list[Any]:
        os.environ["HARNESS_VARIANT"] = "cu126"
        return stamp(remember=True)

    [b_file, _] = as_user(b, b_forces_a_variant)
    assert b_file != a_file and (stamps / a_file).read_bytes() == before

    def forge() -> str:
        data = json.loads((stamps / a_file).read_text())
        data["locks"] = [dict(data["locks"][0], environment=P1, python=P1, objects=[P1])]
        forged = stamps / "forged"
        forged.write_text(json.dumps(data))
        try:
            os.replace(forged, stamps / a_file)
        except PermissionError as exc:
            return str(exc)  # the folder is sticky: b cannot replace a's file
        return ""

    assert as_user(b, forge)
    # Where a's stamp is not there (a cleared it), b can make that name first.
    as_user(a, lambda: (stamps / a_file).unlink())
    as_user(b, lambda: os.replace(stamps / "forged", stamps / a_file))
    assert as_user(a, lambda: stamp(remember=False)[1]) is None, "b's stamp is not a's"
    for plant in (lambda p: p.symlink_to("/dev/zero"), os.mkfifo):

        def replace(plant: Callable[[Path], Any] = plant) -> None:
            (stamps / a_file).unlink()
            plant(stamps / a_file)

        as_user(b, replace)
        assert as_user(a, lambda: stamp(remember=False)[1]) is None


def test_another_members_lock_stamp_decides_nothing_and_a_planted_one_hangs_nothing(
    lab: tuple[User, User], home: Path
) -> None:
    """The no-op re-lock's stamps (``cache/up-to-date/lock-*.json``, lock/stamp.py) are each
    user's own, like the realize's: b's stamp of the same project is another file, and what b
    plants under the name of a's (a fifo, a link to /dev/zero) makes a's ``lock --check``
    neither hang nor fail: it answers as without a stamp. Before, both members shared one
    name, read through whatever was there (a fifo blocked a's command for good)."""
    a, b = lab
    project = _kinematics_project(home.parent / "kproject")
    as_user(a, lambda: init_and_add(home))
    assert os.stat(home / "cache" / "up-to-date").st_mode & stat.S_ISVTX

    def stamp_file() -> str:
        return str(harness.lock.stamp.LockStamps(home / "cache", project, platform=None).file)

    a_file, b_file = as_user(a, stamp_file), as_user(b, stamp_file)
    assert a_file != b_file

    def check() -> tuple[int, str, str]:
        signal.alarm(60)  # a hang fails the test (the child dies) instead of blocking it
        harness.store.shared.apply_group_umask(home)
        return cli(home, "--project", str(project.root), "lock", "--check", "kinematics")

    before = as_user(a, check)
    assert before[0] == 0 and "up to date" in before[1], before
    for plant in (os.mkfifo, lambda p: os.symlink("/dev/zero", p)):

        def plant_as_b(plant: Callable[[str], Any] = plant) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(a_file)
            plant(a_file)

        as_user(b, plant_as_b)
        assert as_user(a, check) == before


def test_settings_another_member_writes_into_the_shared_home_are_not_used(lab: tuple[User, User], home: Path) -> None:
    """The shared home's folder is group-writable, so b can write its config.toml, naming a
    binary cache and a signing key of b's (whose signed environments a would then run) and an
    archive that needs no signature. a, the home's owner, does not take it (a warning names the
    file and b, once); b takes what b wrote; once a writes the file, both take a's."""
    import base64

    a, b = lab
    as_user(a, lambda: init_and_add(home))
    key = "b-1:" + base64.b64encode(b"\1" * 32).decode()
    theirs = f'[cache]\nsubstituters = ["file:///srv/b-cache"]\ntrusted-keys = ["{key}"]\n'
    theirs += "\n[debian-archives.testdeb]\nallow-unsigned = true\n"

    def settings() -> list[Any]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            first = harness.config.load_settings(home)
            again = harness.config.load_settings(home)
        assert first == again
        try:
            unsigned: object = first.debian_trust("testdeb").keyring is None
        except HarnessError as exc:
            unsigned = exc.message
        return [first.substituters, first.trusted_keys, unsigned, err.getvalue()]

    as_user(b, lambda: (home / "config.toml").write_text(theirs))
    substituters, keys, unsigned, err = as_user(a, settings)
    assert (substituters, keys) == ((), ()) and "names no keyring" in unsigned, (substituters, keys, unsigned)
    assert f"warning: {home / 'config.toml'}: written by harness-lab-b" in err and err.count("warning") == 1, err
    substituters, keys, unsigned, err = as_user(b, settings)
    assert (substituters, keys, unsigned, err) == (("file:///srv/b-cache",), (key,), True, "")

    def write_own() -> None:
        (home / "config.toml").unlink()  # the home's folder is not sticky
        (home / "config.toml").write_text('[cache]\nsubstituters = ["file:///srv/lab-cache"]\n')
        os.chmod(home / "config.toml", 0o644)

    as_user(a, write_own)
    for member in (a, b):
        substituters, keys, unsigned, err = as_user(member, settings)
        assert (substituters, err) == (("file:///srv/lab-cache",), ""), (member.name, substituters, err)


def _sdist(name: str) -> bytes:
    """A small sdist (.tar.gz) of project ``name``: a pyproject and a module."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member, text in (
            ("pyproject.toml", f'[build-system]\nrequires = ["setuptools"]\n[project]\nname = "{name}"\n'),
            (f"{name}.py", "print('built')\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_an_sdist_another_member_changes_after_it_was_checked_is_not_built(lab: tuple[User, User], home: Path) -> None:
    """Locking reads what an sdist needs to build by unpacking it and asking its backend, from
    the home's download cache (group-writable). b overwrites a's checked sdist in place between
    the check and the unpacking: a's lock reads the bytes once and checks them again, refused
    naming the sdist and both hashes; b's backend never runs as a."""
    a, b = lab
    data = _sdist("toy")
    sdist = harness.resolve.pins.DistFile("toy-1.0.tar.gz", hashlib.sha256(data).hexdigest(), len(data))
    package = harness.resolve.pins.Package("toy", "1.0", "pypi", sdist=sdist)
    as_user(a, lambda: init_and_add(home))
    download = home / "cache" / "downloads" / sdist.sha256

    def member_a() -> str:
        harness.store.shared.apply_group_umask(home)
        download.write_bytes(data)  # as a download leaves it: checked, group-writable
        with tempfile.TemporaryDirectory(prefix="a-lock-") as scratch:
            options = harness.resolve.sdists.SdistOptions(
                indexes=(),
                settings=harness.config.load_settings(home),
                cache_dir=home / "cache",
                scratch=Path(scratch),
            )
            try:
                return str(harness.resolve.sdists.sdist_build_requirements([package], options))
            except HarnessError as exc:
                return f"{exc.message} {exc.hint}"

    def overwrite() -> None:
        with open(download, "r+b") as handle:
            handle.write(_sdist("evil")[: len(data)].ljust(len(data), b"\0"))

    refused = _race(lab, (harness.resolve.sdists, "fetch_sdist"), member_a, overwrite, home.parent)
    assert "toy 1.0 (sdist toy-1.0.tar.gz)" in refused and "changed after it was checked" in refused, refused
    assert sdist.sha256 in refused and str(download) in refused


def test_a_member_downloading_a_deb_keeps_it_and_the_other_waits_and_uses_it(
    lab: tuple[User, User], home: Path, template: Template
) -> None:
    """b is downloading the template's .deb (holding its lock, half of it in the partial file)
    when a realizes the template: a waits for the lock, leaves b's partial file alone, and then
    uses b's finished download (checked, not downloaded again); both end with it."""
    a, b = lab
    [pin] = template.lock.packages
    data = (template.archive.pool / posixpath.basename(pin.filename)).read_bytes()
    as_user(a, lambda: init_and_add(home))
    debs = home / "cache" / "debs"
    held, go = home.parent / "held", home.parent / "go"

    def member_b() -> str:
        harness.store.shared.apply_group_umask(home)
        debs.mkdir(parents=True)
        with harness.store.store.lock_file(debs / f"{pin.sha256}.lock"):
            part = debs / f"{pin.sha256}.deb.part"
            part.write_bytes(data[: len(data) // 2])
            held.touch()
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            with open(part, "ab") as handle:
                handle.write(data[len(data) // 2 :])
            os.replace(part, debs / f"{pin.sha256}.deb")
        return "downloaded"

    finish_b = start_as_user(b, member_b)
    deadline = time.monotonic() + 60
    while not held.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fetched = len([r for r in template.archive.requests if r.endswith(".deb")])
    finish_a = start_as_user(a, lambda: _realize_template(home, template.project))
    time.sleep(1)  # a is waiting for b's lock by now
    go.touch()
    assert finish_b() == "downloaded"
    assert finish_a() == template.content
    assert len([r for r in template.archive.requests if r.endswith(".deb")]) == fetched, "not downloaded again"
    assert os.stat(debs / f"{pin.sha256}.deb").st_uid == b.uid


def _a_run(home: Path) -> str:
    """As a member: a finished run record of theirs in the shared home (the CLI's umask)."""
    harness.store.shared.apply_group_umask(home)
    run_id = harness.runs.record.new_run_id(time.time() - 3 * 86400)
    folder = harness.runs.record.runs_dir(home) / run_id
    harness.runs.record.write_json(folder / "config.json", {"command": "run"})
    harness.runs.record.write_json(folder / "result.json", {"exit_status": 0})
    return run_id


def test_no_member_can_move_the_layout_or_another_members_runs(lab: tuple[User, User], home: Path) -> None:
    """The home, cache/ and runs/ are sticky: b can neither rename nor delete cache/, runs/,
    store/ nor a's run record (nor prune it: passed by as another member's), and a's commands
    work as before. `store init --group` again turns an older shared home's modes into these."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    for folder in (home, home / "cache", home / "runs"):
        assert os.stat(folder).st_mode & stat.S_ISVTX, folder
    assert not os.stat(home / "cache" / "downloads").st_mode & stat.S_ISVTX  # members replace partial files there
    run_id = as_user(a, lambda: _a_run(home))

    def member_b() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        refused = _refusals(
            {
                "rename cache": lambda: os.rename(home / "cache", home / "cache.old"),
                "rename runs": lambda: os.rename(home / "runs", home / "runs.old"),
                "rename store": lambda: os.rename(home / "store", home / "store.old"),
                "rename downloads": lambda: os.rename(home / "cache" / "downloads", home / "cache" / "d"),
                "rename a's run": lambda: os.rename(home / "runs" / run_id, home / "runs" / "mine"),
                "delete a's run": lambda: os.rmdir(home / "runs" / run_id),
            }
        )
        own = _a_run(home)  # b's own records still go in
        return {"refused": refused, "prune": cli(home, "runs", "prune", "--older-than", "1"), "own": own}

    seen = as_user(b, member_b)
    assert all(seen["refused"].values()), seen["refused"]
    code, out, err = seen["prune"]
    assert code == 0 and "Traceback" not in err, err
    assert f"removed run {seen['own']}" in out and "1 another member's (a shared home)" in out, out
    assert (home / "runs" / run_id / "result.json").is_file() and not (home / "runs" / seen["own"]).exists()

    def member_a() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        return {"ls": cli(home, "store", "ls"), "runs": cli(home, "runs", "--json"), "add": _add_another(home)}

    seen = as_user(a, member_a)
    assert seen["ls"][0] == 0 and P1 in seen["ls"][1], seen["ls"]
    assert seen["runs"][0] == 0 and run_id in seen["runs"][1], seen["runs"]
    assert seen["add"] is True

    # A home shared by an older harness (its folders 2775): init again makes them sticky.
    for folder in (home, home / "cache", home / "runs"):
        os.chmod(folder, 0o2775)
    code, _, err = as_user(a, lambda: cli(home, "store", "init", "--group", GROUP))
    assert code == 0, err
    for folder in (home, home / "cache", home / "runs"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o3775, folder


def _a_recorded_run(home: Path) -> str:
    """As a member: a run record made as `harness run` and a cluster head make theirs (its
    folder, the configuration, the command's log, a shard's live log and record, the result),
    under the CLI's umask in a shared home, which gives the group write access."""
    harness.store.shared.apply_group_umask(home)
    run_id = harness.runs.record.new_run_id()
    folder = harness.runs.record.runs_dir(home) / run_id
    with harness.runs.record.new_record_dir(folder):
        harness.runs.record.write_json(folder / "config.json", {"command": "run"})
    with harness.runs.record.open_record_file(folder / "logs" / "command.log") as log:
        log.write(b"episode 1: ok\n")
    harness.runs.livelog.append_lines(folder / "live" / "0.log", ["shard 0: ok"])
    harness.runs.record.write_json(folder / "shards" / "0" / "shard.json", {"status": "ok"})
    # The command, as `harness run` starts it, writes a file of its own into the record.
    script = 'echo "{\\"score\\": 0.5}" > "$HARNESS_RUN_DIR/score.json"'
    env = {"PATH": "/usr/bin:/bin", "HARNESS_RUN_DIR": str(folder)}
    assert harness.runs.run._run_command(["sh", "-c", script], env, folder, folder / "logs" / "scoring.log", print) == 0
    harness.runs.record.write_json(folder / "result.json", {"exit_status": 0})
    return run_id


def test_no_member_can_change_another_members_run_record(lab: tuple[User, User], home: Path) -> None:
    """A run record's folders and files are writable by their member only, in a shared home
    too: b can neither delete, replace nor add a file of a's record (its result, its logs, a
    shard's record), nor write into one, though the home's umask gives the group write access
    to what the store and caches need; b still reads a's logs. a's record stays as a wrote it."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    run_id = as_user(a, lambda: _a_recorded_run(home))
    folder = home / "runs" / run_id

    def member_b() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        forged = home / "runs" / f"forged-{os.getpid()}.json"  # b's own file, to put in a's place
        forged.write_text('{"exit_status": 0, "score": 1.0}')

        def append(path: Path) -> None:
            with open(path, "ab") as sink:
                sink.write(b"forged\n")

        refused = _refusals(
            {
                "delete the result": lambda: os.unlink(folder / "result.json"),
                "replace the result": lambda: os.rename(forged, folder / "result.json"),
                "add a file": lambda: (folder / "extra.json").write_text("{}"),
                "delete the log": lambda: os.unlink(folder / "logs" / "command.log"),
                "write into the log": lambda: append(folder / "logs" / "command.log"),
                "write into the live log": lambda: append(folder / "live" / "0.log"),
                "add to the live logs": lambda: (folder / "live" / "1.log").write_text("forged\n"),
                "replace a shard's record": lambda: os.unlink(folder / "shards" / "0" / "shard.json"),
                "add a shard": lambda: (folder / "shards" / "1").mkdir(),
                "write into what the command wrote": lambda: append(folder / "score.json"),
            }
        )
        forged.unlink(missing_ok=True)  # in a's record, had the rename gone through
        return {"refused": refused, "log": (folder / "logs" / "command.log").read_text()}

    seen = as_user(b, member_b)
    assert all(seen["refused"].values()), seen["refused"]
    assert seen["log"] == "episode 1: ok\n"
    assert json.loads((folder / "result.json").read_text()) == {"exit_status": 0}
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "live",
        "logs",
        "result.json",
        "score.json",
        "shards",
    ]
    assert json.loads((folder / "score.json").read_text()) == {"score": 0.5}
    assert (folder / "live" / "0.log").read_text() == "shard 0: ok\n"
    assert [p.name for p in (folder / "shards").iterdir()] == ["0"]


def test_a_run_folder_another_member_made_first_is_refused_not_written_into(lab: tuple[User, User], home: Path) -> None:
    """b guesses a's next run id and makes that folder first, open to all: a's run refuses
    it, naming b's uid, and writes nothing into it (the record would be b's to change)."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    folder = home / "runs" / "20261205-120000-000-abcd"

    def squat() -> None:
        folder.mkdir()
        folder.chmod(0o777)

    as_user(b, squat)

    def member_a() -> str:
        harness.store.shared.apply_group_umask(home)
        try:
            with harness.runs.record.new_record_dir(folder):
                harness.runs.record.write_json(folder / "config.json", {"command": "run"})
        except HarnessError as exc:
            return str(exc)
        return "used"

    said = as_user(a, member_a)
    assert "of another user" in said and f"uid {b.uid}" in said, said
    assert list(folder.iterdir()) == [] and os.stat(folder).st_uid == b.uid


def test_no_member_can_plant_what_a_cluster_head_reads_back(
    lab: tuple[User, User], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster run on Slurm (submitit's local executor here) in a shared home: submitit's
    job folders, the pickles it submits and each task's result, which a's head unpickles,
    and the results tasks hand over early are not the group's to write, though the CLI's
    umask there gives the group write access. b can neither plant nor replace a result
    (their code, unpickled as a) nor add a job or a hand-over."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    import site
    import sys

    import harness.runs.cluster as cluster
    from harness.runs.shard import ShardJob
    from tests.conftest import REPO

    if not os.access("/usr/bin/python3", os.X_OK) or sys.version_info[:2] != (3, 11):
        pytest.skip("needs /usr/bin/python3 of this interpreter's minor version for a's tasks")
    # The tasks run as a, who may not reach this interpreter (CI's is in root's home): they
    # (and submitit's process that watches them) run on the distribution's, with this venv's
    # packages and the checkout on its path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*site.getsitepackages(), str(REPO)]))
    as_user(a := lab[0], lambda: init_and_add(home))
    b = lab[1]
    run_dir = home / "runs" / "20261205-120000-000-beef"

    def task(job: ShardJob) -> dict[str, object]:  # pickled by value: the task needs no test module
        from harness.runs.cluster import hand_over

        result: dict[str, object] = {"index": job.index, "shard": f"{job.index}/{job.count}", "status": "ok"}
        hand_over(job, result)
        return result

    def member_a() -> list[object]:
        sys.executable = "/usr/bin/python3"  # in a's child only
        harness.store.shared.apply_group_umask(home)  # what the CLI does in a shared home
        with harness.runs.record.new_record_dir(run_dir):
            pass
        jobs = [ShardJob(run_dir.name, 0, 1, str(home.parent), None, (), None, (), (), None, None, False)]
        engine = cluster.SubmititEngine(local=True, task=task)
        kwargs = dict(cpus=1.0, gpus=0, retries=0, echo=lambda _: None, on_result=lambda _: None)
        return [r["status"] for r in engine.run(jobs, folder=run_dir / "engine", **kwargs)]

    assert as_user(a, member_a) == ["ok"]
    engine = run_dir / "engine"
    [job] = [p for p in engine.iterdir() if p.name.isdigit()]  # the task's (its job id)
    [result] = job.glob("*_result.pkl")
    [submitted] = job.glob("*_submitted.pkl")
    handed = engine / cluster.HANDED_OVER
    assert (handed / "0.json").is_file()
    before = result.read_bytes()

    def member_b() -> dict[str, str]:
        harness.store.shared.apply_group_umask(home)

        def forged(name: str) -> Path:  # b's own file, to put in a's place
            path = home / "runs" / f"forged-{os.getpid()}-{name}"
            path.write_bytes(pickle.dumps(("success", {"status": "ok", "score": 1.0})))
            return path

        def append(path: Path) -> None:
            with open(path, "ab") as sink:
                sink.write(b"forged")

        refused = _refusals(
            {
                "add a job": lambda: (engine / "999").mkdir(),
                "add to submitit's own folder": lambda: (engine / "%j" / "999").mkdir(),
                "add a file to a job": lambda: (job / "999_0_result.pkl").write_bytes(b""),
                "replace a task's result": lambda: os.rename(forged("result"), result),
                "write into a task's result": lambda: append(result),
                "write into the submitted task": lambda: append(submitted),
                "hand a result over": lambda: (handed / "1.json").write_text('{"status": "ok"}'),
                "replace a hand-over": lambda: os.rename(forged("handed"), handed / "0.json"),
            }
        )
        for path in (home / "runs").glob(f"forged-{os.getpid()}-*"):
            path.unlink()
        return refused

    refused = as_user(b, member_b)
    assert all(refused.values()), refused
    assert result.read_bytes() == before
    assert sorted(p.name for p in handed.iterdir()) == ["0.json"]


def _add_another(home: Path) -> bool:
    name = "1" * 32 + "-added-after"
    Store.in_home(home).add(name, "weights", build_tree)
    return Store.in_home(home).is_registered(name)


def test_a_folder_another_member_made_under_a_members_deb_folder_name_costs_nothing(
    lab: tuple[User, User], home: Path, template: Template
) -> None:
    """b makes cache/debs a link to a folder of b's and makes cache/debs-<a's uid> first (a
    folder of b's, open to all): a cannot remove either (cache/ is sticky), and a's realize
    still builds the template, downloading into a fresh folder of a's own (0700), which a's
    next realize finds again (no second download)."""
    a, b = lab
    [pin] = template.lock.packages
    as_user(a, lambda: init_and_add(home))
    cache = home / "cache"
    theirs = home.parent / "b-debs"

    def squat() -> None:
        theirs.mkdir()
        (cache / "debs").symlink_to(theirs)
        (cache / f"debs-{a.uid}").mkdir()
        (cache / f"debs-{a.uid}").chmod(0o777)

    as_user(b, squat)
    fetched = len([r for r in template.archive.requests if r.endswith(".deb")])
    assert as_user(a, lambda: _realize_template(home, template.project)) == template.content
    assert len([r for r in template.archive.requests if r.endswith(".deb")]) == fetched + 1
    assert list(theirs.iterdir()) == [] and list((cache / f"debs-{a.uid}").iterdir()) == []
    [own] = cache.glob(f"debs-{a.uid}-*")
    assert os.stat(own).st_uid == a.uid and os.stat(own).st_mode & 0o777 == 0o700
    assert hashlib.sha256((own / f"{pin.sha256}.deb").read_bytes()).hexdigest() == pin.sha256

    as_user(a, lambda: Store.in_home(home).delete(template.lock.store))
    assert as_user(a, lambda: _realize_template(home, template.project)) == template.content
    assert len([r for r in template.archive.requests if r.endswith(".deb")]) == fetched + 1, "found again"
    assert list(cache.glob(f"debs-{a.uid}-*")) == [own]


def test_a_member_cannot_plant_a_hook_a_setting_or_a_branch_in_a_git_mirror_another_fetches_into(
    lab: tuple[User, User], home: Path
) -> None:
    """Git runs a repository's hooks and reads its config and refs: in a mirror the group
    could write, member b could plant a ``reference-transaction`` hook (run as member a by
    a's next fetch), a ``url.<b's>.insteadOf`` setting (a's fetch then read b's repository:
    a's lock pinned b's commit before each member had mirrors of their own) or move the
    ``main`` an offline lock resolves. b can do none of it to a's mirror, and a's next locks,
    offline and online, run no code of b's and pin upstream's commits."""
    a, b = lab
    upstream, theirs = home.parent / "upstream", home.parent / "bs-repo"
    marker = home.parent / "hook-ran"

    def lock_as_a() -> Any:
        init_and_add(home)
        _make_upstream(upstream)
        pin = harness.resolve.git.lock_source(Source(repo=upstream.as_uri(), rev="main"), home / "cache")
        return pin, str(harness.resolve.git.mirror_path(home / "cache", pin.repo))

    pin, mirror_of_a = as_user(a, lock_as_a)

    def plant_as_b() -> dict[str, str]:
        _make_upstream(theirs)
        (theirs / "setup.py").write_text("print('pwned')\n")
        subprocess.run(["git", "commit", "-qam", "b's"], cwd=theirs, check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(theirs)], check=True)
        mirror = Path(mirror_of_a)
        theirs_head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=theirs, capture_output=True, check=True)

        def hook() -> None:
            (mirror / "hooks" / "reference-transaction").write_text(f"#!/bin/sh\ntouch {marker}\n")

        def setting() -> None:
            with open(mirror / "config", "a") as config:
                config.write(f'[url "{theirs.as_uri()}"]\n\tinsteadOf = {upstream.as_uri()}\n')

        def branch() -> None:
            (mirror / "refs" / "heads" / "main").write_text(theirs_head.stdout.decode())

        return _refusals({"hook": hook, "setting": setting, "branch": branch})

    refused = as_user(b, plant_as_b)
    assert all(refused.values()), f"b wrote into a's mirror: {refused}"

    def lock_again_as_a() -> Any:
        offline = harness.resolve.git.lock_source(
            Source(repo=upstream.as_uri(), rev="main"), home / "cache", offline=True
        )
        (upstream / "setup.py").write_text("print('second')\n")
        subprocess.run(["git", "commit", "-qam", "second"], cwd=upstream, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=upstream, capture_output=True, check=True)
        online = harness.resolve.git.lock_source(Source(repo=upstream.as_uri(), rev="main"), home / "cache")
        return offline.commit, online.commit, head.stdout.decode().strip()

    offline, online, head = as_user(a, lock_again_as_a)
    assert offline == pin.commit and online == head != pin.commit
    assert not marker.exists(), "b's hook ran as a"


def test_sharing_a_home_keeps_its_makers_broker_token_and_run_records_theirs(
    lab: tuple[User, User], home: Path
) -> None:
    """Member a shares a home a already used: a running broker's token (0600 in its 0700
    state folder) and a's run records were there. ``store init --group`` hands the home to
    the group, but member b still can neither read the token (which would let b drive a's
    services) nor change or add to a's run records; b reads the records, as audits do.
    Before, the token became 0660 in a 2770 folder and the records group-writable."""
    a, b = lab
    record = home / "runs" / "20261206-000000-abcd"

    def use_then_share_as_a() -> int:
        os.umask(0o022)
        write_token(home / "state" / "project-0123456789abcdef", "secret-token")
        record.mkdir(parents=True)
        (record / "config.json").write_text('{"agent": "a"}\n')
        return cli(home, "store", "init", "--group", GROUP)[0]

    assert as_user(a, use_then_share_as_a) == 0
    token = home / "state" / "project-0123456789abcdef" / "broker.token"

    def attempts_as_b() -> tuple[dict[str, str], str]:
        refused = _refusals(
            {
                "read the token": token.read_text,
                "change a record": lambda: (record / "config.json").write_text('{"agent": "b"}\n'),
                "add to a record": lambda: (record / "result.json").write_text("{}\n"),
            }
        )
        return refused, (record / "config.json").read_text()

    refused, seen = as_user(b, attempts_as_b)
    assert all(refused.values()), f"b went through: {refused}"
    assert seen == '{"agent": "a"}\n'


def test_a_stand_in_note_another_member_wrote_or_planted_never_takes_the_place_of_ones_own(
    lab: tuple[User, User], home: Path
) -> None:
    """Where a lock's interpreter cannot be had, each member's realize notes which host copy
    stands in for it. In a home root made, member b's notes (b's own copy, and one b planted
    where older harness versions kept a single note for everyone) point at b's paths, which
    a does not trust: a's own note is a's, and b's never stand in for a, nor keep a from
    noting a's own; b goes on using b's. Before, the first note was everyone's and sticky:
    a's could not be written (a warning said so) and a found no interpreter standing in."""
    a, b = lab
    root = User("root", 0, 0, (grp.getgrnam(GROUP).gr_gid,))
    python = "1" * 32 + "-cpython-3.11.7"
    host_a, host_b = "2" * 32 + "-cpython-3.11.7-host", "3" * 32 + "-cpython-3.11.7-host"

    def copy_of(text: str) -> Callable[[Path], BuildResult]:
        def build(out: Path) -> BuildResult:
            (out / "bin").mkdir(parents=True)
            (out / "bin" / "python3").write_text(text)
            return BuildResult(obtained="test")

        return build

    def note_as(user: str, host: str, *, plant: bool = False) -> Callable[[], tuple[str | None, str | None, str]]:
        def note() -> tuple[str | None, str | None, str]:
            harness.store.shared.apply_group_umask(home)
            store = Store.in_home(home)
            before = harness.store.standins.standin_for(store, python)
            store.add(host, "python", copy_of(f"#!/bin/sh\necho {user}\n"))
            harness.store.standins.remember_standin(store, python, host, f"{user}'s")
            if plant:  # where older versions kept everyone's note
                legacy = home / "store" / harness.store.standins.STANDINS / python
                legacy.write_text(json.dumps({"host": host, "reason": "planted"}))
            after = harness.store.standins.standin_for(store, python)
            return before, after, harness.store.standins.standin_reason(store, python)

        return note

    assert as_user(root, lambda: cli(home, "store", "init", "--group", GROUP)[0]) == 0
    assert as_user(b, note_as("b", host_b, plant=True))[:2] == (None, host_b)
    assert as_user(a, note_as("a", host_a)) == (None, host_a, "a's")
    assert as_user(b, lambda: harness.store.standins.standin_for(Store.in_home(home), python)) == host_b


def test_a_broker_another_member_plants_in_a_projects_state_folder_is_never_used(
    lab: tuple[User, User], home: Path
) -> None:
    """A project's state folder in a shared home has a fixed name, and another member can
    make it before its owner first uses it: member b plants a ``broker.json`` naming a live
    process of b's (a broker of b's would answer) and a token beside it. Member a's harness
    and ``harness.client`` find no broker there, so a's runs never send their requests (and
    a's token) to b; nor does a's ``down`` act on a pid file b planted (it could name any
    process of a's), nor start a broker in b's folder. Before, all of them took b's."""
    import harness.client
    from harness.runtime.broker import STATE_MARKER, SharedBroker, read_state, read_token
    from harness.runtime.session import default_state_dir
    from harness.runtime.supervisor import PIDFILE_MARKER, make_state_dir, read_pidfiles

    a, b = lab
    state = default_state_dir(home, home.parent / "project-of-a", None)

    def plant_as_b() -> int:
        harness.store.shared.apply_group_umask(home)
        sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
        state.mkdir(parents=True, mode=0o775)
        state.chmod(0o775)
        planted = {
            "harness": STATE_MARKER,
            "url": "http://127.0.0.1:9",
            "pid": sleeper.pid,
            "create_time": psutil.Process(sleeper.pid).create_time(),
            "started": time.time(),
            "services": [],
        }
        (state / "broker.json").write_text(json.dumps(planted))
        (state / "broker.token").write_text("b's token\n")
        (state / "pids").mkdir(mode=0o775)
        (state / "pids").chmod(0o775)  # a pid file for a's `down` to act on
        pidfile = {"harness": PIDFILE_MARKER, "name": "svc", "pid": os.getppid(), "pgid": os.getppid()}
        (state / "pids" / "svc.json").write_text(json.dumps(pidfile))
        for name in ("broker.json", "broker.token", "pids/svc.json"):
            (state / name).chmod(0o644)
        return sleeper.pid

    as_user(a, lambda: init_and_add(home))
    pid = as_user(b, plant_as_b)
    try:

        def look_as_a() -> tuple[Any, ...]:
            try:
                address = harness.client._find_address(None, state)
            except harness.client.BrokerUnavailable as exc:
                address = str(exc)
            try:
                make_state_dir(state)
                refused = ""
            except HarnessError as exc:
                refused = exc.message
            found = read_state(state), read_token(state), SharedBroker.find(state), read_pidfiles(state)
            # a's own commands take a state folder of a's own instead, the same one each time.
            own = default_state_dir(home, home.parent / "project-of-a", None)
            made = make_state_dir(own)
            again = default_state_dir(home, home.parent / "project-of-a", None)
            return *found, address, refused, str(own), str(made), str(again), os.stat(own).st_uid

        found, token, broker, pids, address, refused, own, made, again, owner = as_user(a, look_as_a)
        assert (found, token, broker, pids) == (None, None, None, [])
        # Nor does a's `up` start a broker there: b could replace what it writes (its config).
        assert f"this state folder is {b.name}'s, not a folder of yours" in refused, refused
        assert own == made == again and own.startswith(f"{state}-") and owner == a.uid, (own, again, state)
        assert "not yours" in address, address
    finally:
        os.kill(pid, signal.SIGKILL)


def _deploy_project(root: Path) -> Path:
    """A project of two services with ports, readable by both members."""
    (root / "services").mkdir(parents=True)
    for name, port in (("alpha", 9310), ("beta", 9311)):
        (root / "services" / f"{name}.toml").write_text(
            f'kind = "{name}"\nsummary = "a service"\ncommand = ["{{python}}", "-c", "pass"]\nport = {port}\n\n'
            '[environment]\npython = "3.11"\nrequirements = []\n'
        )
    for folder in (root, root / "services"):
        folder.chmod(0o755)
    return root


def _deploy_write(home: Path, project: Path, out: Path) -> tuple[int, str, dict[str, Any]]:
    """``deploy write`` as the calling member (the CLI in-process): exit code, stderr, and the
    deploy it wrote (its ``state`` and its services' ports)."""
    import tomllib

    harness.store.shared.apply_group_umask(home)
    code, _, err = cli(home, "--project", str(project), "deploy", "write", "-o", str(out), "--gpus", "1x24")
    written = tomllib.loads(out.read_text()) if code == 0 else {}
    ports = {n: s["port"] for n, s in written.get("services", {}).items() if "port" in s}
    return code, err, {"state": written.get("state"), "ports": ports}


def test_no_member_can_move_plant_or_squat_what_another_members_deploys_keep_in_state(
    lab: tuple[User, User], home: Path
) -> None:
    """``state/`` and the port registry are sticky in a shared home: b cannot rename ``state/``,
    a's state folder or a's reserved ports; what b plants there first (a link as the registry's
    lock and as a's registry file, a's deploy's state folder under its name) fails nothing for
    a, and nothing is written through it; a's deploy takes no port b's deploy reserved, and its
    state folder is a's own. Before, ``state/`` was group-writable without the sticky bit."""
    from harness.runtime.deploywrite import instance_state

    a, b = lab
    as_user(a, lambda: init_and_add(home))
    project = _deploy_project(home.parent / "project")
    victim = home.parent / "victim.txt"
    victim.write_text("a's file\n")
    victim.chmod(0o666)
    a_out, b_out = home.parent / "a.toml", home.parent / "b.toml"

    def member_b() -> dict[str, Any]:
        registry = home / "state" / "ports"
        (registry / ".lock").symlink_to(victim)
        (registry / f"{a.uid}.json").symlink_to(victim)
        squatted = instance_state(home, project, a_out)  # the name a's deploy will ask for
        squatted.mkdir(mode=0o775)
        code, err, written = _deploy_write(home, project, b_out)
        return {"code": code, "err": err, "written": written, "squatted": str(squatted)}

    seen_b = as_user(b, member_b)
    assert seen_b["code"] == 0, seen_b["err"]
    code, err, written = as_user(a, lambda: _deploy_write(home, project, a_out))
    assert code == 0 and "Traceback" not in err, err
    assert written["ports"] and not set(written["ports"].values()) & set(seen_b["written"]["ports"].values())
    assert written["state"] != seen_b["squatted"] and os.stat(written["state"]).st_uid == a.uid, written
    assert victim.read_text() == "a's file\n", "nothing was written through b's links"
    a_files = [p for p in (home / "state" / "ports").glob(f"{a.uid}-*.json") if os.lstat(p).st_uid == a.uid]
    assert len(a_files) == 1

    def moves_of_b() -> dict[str, str]:
        return _refusals(
            {
                "rename state": lambda: os.rename(home / "state", home / "state.old"),
                "rename the registry": lambda: os.rename(home / "state" / "ports", home / "state" / "p"),
                "rename a's state": lambda: os.rename(written["state"], home / "state" / "mine"),
                "delete a's ports": lambda: a_files[0].unlink(),
                "replace a's ports": lambda: os.rename(home / "state" / "ports" / f"{b.uid}.json", a_files[0]),
            }
        )

    refused = as_user(b, moves_of_b)
    assert all(refused.values()), refused
    # b's next write still sees a's reservation.
    code, err, again = as_user(b, lambda: _deploy_write(home, project, home.parent / "b2.toml"))
    assert code == 0 and not set(again["ports"].values()) & set(written["ports"].values()), (err, again)


def _a_private_folder(home: Path) -> Path:
    """As a member: a folder of theirs outside the home that only they can read."""
    private = home.parent / "a-private"
    private.mkdir(mode=0o700)
    (private / "config.toml").write_text("token = 'a-secret'\n")
    (private / "sub").mkdir()
    (private / "sub" / "key").write_text("a's key\n")
    return private


def _intact(private: Path) -> list[str]:
    return sorted(str(p.relative_to(private)) for p in private.rglob("*"))


def test_no_member_can_make_another_delete_through_a_planted_trash_or_roots_folder(
    lab: tuple[User, User], home: Path
) -> None:
    """`runs prune` empties a trash folder and gc removes dead holders' roots files: b plants
    links to a private folder of a's in their places (the roots folder as in a home shared by
    an older harness, which had no such layout folder). a's commands delete nothing of it
    and gc says what is wrong; `store init --group` again makes the folder anew. The roots
    folders are sticky: b cannot remove the roots a live process of a's holds."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    for name in ("temp", "procs"):
        assert stat.S_IMODE(os.stat(home / "store" / ".roots" / name).st_mode) == 0o3775, name
    private = as_user(a, lambda: _a_private_folder(home))
    before = _intact(private)
    assert before == ["config.toml", "sub", "sub/key"]
    os.rmdir(home / "store" / ".roots" / "temp")  # a home an older harness shared

    os.unlink(home / "store" / ".roots" / "gc.lock")  # nor the gc lock, which b makes first

    def member_b() -> None:
        os.symlink(private, home / "store" / ".roots" / "temp")
        os.symlink(private, home / "runs" / f".trash-{a.uid}")
        os.symlink(private, home / "runs" / ".trash")
        fd = os.open(home / "store" / ".roots" / "gc.lock", os.O_CREAT | os.O_RDONLY, 0o644)
        os.fchmod(fd, 0o644)  # as an older harness made it: every member could lock it
        os.close(fd)

    as_user(b, member_b)

    def member_a() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        run_id = _a_run(home)
        return {
            "gc": cli(home, "store", "gc", "--dry-run"),
            "prune": cli(home, "runs", "prune", "--older-than", "1"),
            "run": run_id,
        }

    seen = as_user(a, member_a)
    assert _intact(private) == before
    code, out, err = seen["gc"]
    assert code != 0 and "Traceback" not in err, err
    assert "a link made by harness-lab-b" in err and "store init --group" in err, err
    code, out, err = seen["prune"]
    assert "Traceback" not in err and _intact(private) == before, err

    code, _, err = as_user(a, lambda: cli(home, "store", "init", "--group", GROUP))
    assert code == 0, err
    assert stat.S_IMODE(os.stat(home / "store" / ".roots" / "temp").st_mode) == 0o3775
    assert os.stat(home / "store" / ".roots" / "gc.lock").st_uid == a.uid  # b's could be deleted under a gc

    def member_a_again() -> dict[str, Any]:
        harness.store.shared.apply_group_umask(home)
        return {"gc": cli(home, "store", "gc", "--dry-run"), "prune": cli(home, "runs", "prune", "--older-than", "1")}

    seen_again = as_user(a, member_a_again)
    assert seen_again["gc"][0] == 0, seen_again["gc"]
    code, out, err = seen_again["prune"]
    assert code == 0 and f"removed run {seen['run']}" in out, (out, err)
    assert _intact(private) == before and os.path.islink(home / "runs" / f".trash-{a.uid}")

    # A live process of a's holds P1: b cannot remove its roots file.
    ready, release = home.parent / "held", home.parent / "release"

    def holder() -> None:
        harness.store.shared.apply_group_umask(home)
        with harness.store.roots.held(Store.in_home(home), [P1], "a's run") as roots:
            ready.write_text(str(roots.path))
            deadline = time.monotonic() + 60
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    finish = start_as_user(a, holder)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    held_file = Path(ready.read_text())
    refused = as_user(
        b,
        lambda: _refusals(
            {
                "delete a's roots": lambda: os.unlink(held_file),
                "delete the gc lock": lambda: os.unlink(home / "store" / ".roots" / "gc.lock"),
            }
        ),
    )
    release.write_text("")
    finish()
    assert all(refused.values()), refused


def test_a_planted_run_record_hangs_nothing_reads_nothing_of_a_members_and_is_never_their_latest(
    lab: tuple[User, User], home: Path
) -> None:
    """b makes a run folder dated years ahead, with fifos for its result and events, a link
    to a's private file as its pin, and a closure naming a's private folder. a's `runs` lists
    it without hanging; a's `runs pin latest` pins a's own newest run and writes nothing
    through b's link; a's `audit` of b's run says the record is damaged, hashes nothing of
    a's and does not hang; a's `report` of it writes only a file of its own."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    run_id = as_user(a, lambda: _a_run(home))
    private = as_user(a, lambda: _a_private_folder(home))
    secret = (private / "config.toml").read_text()
    fake = "20991231-235959-999-ffff"
    folder = home / "runs" / fake

    def member_b() -> None:
        folder.mkdir()
        folder.chmod(0o777)
        (folder / "config.json").write_text(json.dumps({"command": "run", "agent": "not an object"}))
        os.mkfifo(folder / "result.json")
        (folder / "services").mkdir()
        os.mkfifo(folder / "services" / "events.jsonl")
        os.symlink(private / "config.toml", folder / "pinned")
        closure = {
            "store_paths": [{"path": "../../a-private", "content": "blake3:00"}],
            "project_files": {"../a-private/config.toml": "sha256:00"},
        }
        (folder / "lock.json").write_text(json.dumps(closure))
        planted = folder / ".report.html.tmp"
        planted.write_text("")
        planted.chmod(0o666)

    as_user(b, member_b)

    def member_a() -> dict[str, Any]:
        signal.alarm(120)  # a hang fails the test instead of blocking it
        harness.store.shared.apply_group_umask(home)
        return {
            "runs": cli(home, "runs", "--json"),
            "pin": cli(home, "runs", "pin", "latest"),
            "audit": cli(home, "audit", fake),
            "report": cli(home, "report", fake, "--no-audit"),
        }

    seen = as_user(a, member_a)
    code, out, err = seen["runs"]
    assert code == 0 and fake in out and run_id in out, (out, err)
    code, out, err = seen["pin"]
    assert code == 0 and run_id in out and fake not in out, (out, err)
    assert (home / "runs" / run_id / "pinned").is_file()
    assert (private / "config.toml").read_text() == secret
    code, out, err = seen["audit"]
    assert code != 0 and "Traceback" not in err, err
    assert "the run record is damaged" in out + err, (out, err)
    assert "config.toml" not in out + err.replace("../a-private/config.toml", ""), (out, err)
    code, out, err = seen["report"]
    assert "Traceback" not in err, err
    assert (folder / ".report.html.tmp").read_text() == ""  # b's file: never written into


def test_no_member_can_push_another_members_runs_out_of_the_last_n_nor_block_their_gc(
    lab: tuple[User, User], home: Path
) -> None:
    """gc keeps what each member's last N runs used: b's ten folders dated years ahead do not
    push a's run out, so P1, which only a's run names, stays. b's project roots with fields
    of the wrong types and a fifo for a lock make a's gc neither fail nor hang; a missing
    project of a's, which b may not forget, does not stop b's gc."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    content = Store.in_home(home).record(P1).content  # type: ignore[union-attr]

    def member_a() -> str:
        harness.store.shared.apply_group_umask(home)
        run_id = _a_run(home)
        closure = {"store_paths": [{"path": P1, "content": content}]}
        harness.runs.record.write_json(home / "runs" / run_id / "lock.json", closure)
        projects = home / "store" / ".roots" / "projects"
        (projects / f"eeee-{a.uid}.json").write_text(
            json.dumps({"root": "/nonexistent-a-project", "locks": {}, "code": {}, "missing_since": 1})
        )
        return run_id

    run_id = as_user(a, member_a)

    def member_b() -> tuple[int, str, str]:
        harness.store.shared.apply_group_umask(home)
        for i in range(10):
            folder = home / "runs" / f"20991231-2359{i}9-000-b00{i}"
            folder.mkdir()
            (folder / "lock.json").write_text('{"store_paths": []}')
        projects = home / "store" / ".roots" / "projects"
        (projects / f"bbbb-{b.uid}.json").write_text(json.dumps({"root": "/nonexistent", "locks": [1]}))
        (projects / f"cccc-{b.uid}.json").write_text(json.dumps({"root": "/nonexistent", "missing_since": "soon"}))
        project = home.parent / "b-project"
        (project / "locks").mkdir(parents=True)
        os.mkfifo(project / "locks" / "x.lock.toml")
        (projects / f"dddd-{b.uid}.json").write_text(json.dumps({"root": str(project), "locks": {}, "code": {}}))
        return cli(home, "store", "gc", "--forget-missing")

    code, out, err = as_user(b, member_b)
    assert code == 0 and "Traceback" not in err, (out, err)
    assert (home / "store" / ".roots" / "projects" / f"eeee-{a.uid}.json").is_file()

    def member_a_gc() -> tuple[int, str, str]:
        signal.alarm(120)  # a hang fails the test instead of blocking it
        harness.store.shared.apply_group_umask(home)
        return cli(home, "store", "gc")

    code, out, err = as_user(a, member_a_gc)
    assert code == 0 and "Traceback" not in err, (out, err)
    assert P1 not in out and (home / "store" / P1).is_dir(), out
    assert (home / "runs" / run_id / "lock.json").is_file()


def test_another_members_bytecode_index_files_are_never_believed_nor_made_ones_own(
    lab: tuple[User, User], home: Path
) -> None:
    """b puts an index file mapping a source to b's pyc (with one damaged line) and a fifo in
    the folder of an interpreter a uses. Before, a's gc rewrote b's file without the damaged
    line, which made it a's and so believed: a's next environment got b's pyc. Now a's
    lookup and gc leave b's files as they are, believe none, and do not hang on the fifo."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    assert os.stat(home / "store" / ".bytecode").st_mode & stat.S_ISVTX
    interpreter = "2" * 32 + "-cpython-3.11.7"
    key = harness.store.bytecode.entry_key(interpreter, "lib/victim.py", "0" * 64)
    planted = home / "store" / ".bytecode" / interpreter / ("3" * 32 + "-b-env")

    def member_b() -> None:
        harness.store.shared.apply_group_umask(home)
        data = b"b's pyc"
        pyc = blake3.blake3(data).hexdigest()
        (home / "store" / ".links" / pyc).write_bytes(data)
        planted.parent.mkdir()
        planted.parent.chmod(0o2777)
        check = blake3.blake3(f"{key} {pyc}".encode()).hexdigest()[:16]
        planted.write_text(f"{key} {pyc} {check}\ngarbage\n")
        os.mkfifo(planted.parent / ("4" * 32 + "-b-fifo"))

    as_user(b, member_b)

    def member_a() -> tuple[str | None, str | None]:
        signal.alarm(60)  # a hang fails the test instead of blocking it
        before = harness.store.bytecode.BytecodeIndex(home / "store", interpreter).lookup(key)
        harness.store.bytecode.prune(home / "store", [interpreter])
        return before, harness.store.bytecode.BytecodeIndex(home / "store", interpreter).lookup(key)

    assert as_user(a, member_a) == (None, None)
    assert os.stat(planted).st_uid == b.uid and "garbage" in planted.read_text()


def test_a_fingerprint_another_member_takes_of_their_own_path_is_not_believed(
    lab: tuple[User, User], home: Path
) -> None:
    """b changes a file of a path b registered (its owner may chmod it), resets its mtime and
    takes the path's fingerprint again. Before, a's launch check believed the fingerprint of
    the path's owner and took the changed bytes as checked; now only a fingerprint a (or root)
    took counts: a re-hashes, and after that keeps one of its own beside b's."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    name = "5" * 32 + "-registered-by-b"

    def member_b() -> str:
        harness.store.shared.apply_group_umask(home)
        store = Store.in_home(home)
        record = store.add(name, "weights", build_tree)
        data = store.root / name / "data.txt"
        os.chmod(data, 0o644)
        data.write_text("changed\n")
        os.utime(data, (1, 1))
        os.chmod(data, 0o444)
        harness.store.statfile.write_fingerprint(store.root, name, record.content)
        os.chmod(harness.store.statfile.fingerprint_path(store.root, name), 0o644)
        return record.content

    content = as_user(b, member_b)

    def member_a() -> tuple[list[str] | None, bool, list[str] | None]:
        root = home / "store"
        first = harness.store.statfile.changed_entries(root, name, content)
        wrote = harness.store.statfile.write_fingerprint(root, name, content)
        return first, wrote, harness.store.statfile.changed_entries(root, name, content)

    first, wrote, second = as_user(a, member_a)
    assert first is None  # b's: not believed, so a re-hashes
    assert wrote and second == []
    assert (home / "store" / ".stat" / f"{name}.{a.uid}.json").is_file()


def test_what_another_member_puts_in_the_file_pool_neither_hangs_nor_fails_a_build(
    lab: tuple[User, User], home: Path
) -> None:
    """b puts a fifo in the file pool under the name of one of the files a's environment
    will hold, and a file anyone may write under another's. Before, a's build hung on the
    fifo, and the writable file became a's file and then failed a's build; now a's
    environment registers and verifies, with those files unshared."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    one, two = b"one of a's files\n", b"another of a's files\n"

    def member_b() -> None:
        harness.store.shared.apply_group_umask(home)
        links = home / "store" / ".links"
        os.mkfifo(links / blake3.blake3(one).hexdigest())
        (links / blake3.blake3(two).hexdigest()).write_bytes(two)
        (links / blake3.blake3(two).hexdigest()).chmod(0o666)

    as_user(b, member_b)

    def build(out: Path) -> BuildResult:
        out.mkdir()
        (out / "one.txt").write_bytes(one)
        (out / "two.txt").write_bytes(two)
        return BuildResult(obtained="test")

    def member_a() -> list[Any]:
        signal.alarm(60)  # a hang fails the test instead of blocking it
        harness.store.shared.apply_group_umask(home)
        store = Store.in_home(home)
        store.add("6" * 32 + "-a-env", "environment", build)
        return harness.store.verify.verify_store(store, check_contents=True)

    findings = as_user(a, member_a)
    assert all(f.status == "ok" for f in findings if f.name.endswith("-a-env")), findings


def test_another_members_fifo_among_the_locks_or_huge_record_fails_no_command(
    lab: tuple[User, User], home: Path
) -> None:
    """A fifo b puts among the store's locks under the name of a's leftover build made a's gc
    (and every realize, which tidies first) fail; a record of b's with a size no float holds
    made a's `store ls` fail with an internal error. Both commands now go on."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    leftover = "7" * 32 + "-left"

    def member_a_leaves() -> None:
        harness.store.shared.apply_group_umask(home)
        (home / "store" / ".tmp" / f"{leftover}.abcd").mkdir()

    as_user(a, member_a_leaves)

    def member_b() -> None:
        harness.store.shared.apply_group_umask(home)
        os.mkfifo(home / "store" / ".locks" / f"{leftover}Z.lock")
        store = Store.in_home(home)
        name = "8" * 32 + "-huge"
        store.add(name, "weights", build_tree)
        path = store.record_path(name)
        data = json.loads(path.read_text())
        data["nar_size"] = 10**400
        path.chmod(0o644)
        path.write_text(json.dumps(data))

    as_user(b, member_b)

    def member_a() -> dict[str, Any]:
        signal.alarm(60)
        harness.store.shared.apply_group_umask(home)
        return {"gc": cli(home, "store", "gc"), "ls": cli(home, "store", "ls")}

    seen = as_user(a, member_a)
    assert seen["gc"][0] == 0, seen["gc"]
    assert seen["ls"][0] == 0 and "internal error" not in seen["ls"][2], seen["ls"]


def test_stand_in_notes_another_member_plants_in_ones_own_folder_or_for_no_interpreter_say_nothing(
    lab: tuple[User, User], home: Path
) -> None:
    """b makes a's folder of stand-in notes before a does and puts a note there naming P1 (a
    path a registered, weights) as the host copy standing in for an interpreter, and the same
    note in b's own folder. Before, a took P1 for its interpreter; now a note counts only from
    the member its folder is named for, and only for a registered interpreter."""
    a, b = lab
    as_user(a, lambda: init_and_add(home))
    interpreter = "9" * 32 + "-cpython-3.11.7"
    note = json.dumps({"host": P1, "reason": "planted by b"})

    def member_b() -> None:
        for uid in (a.uid, b.uid):
            folder = home / "store" / ".standins" / str(uid)
            folder.mkdir()
            folder.chmod(0o755)
            (folder / interpreter).write_text(note)
            (folder / interpreter).chmod(0o644)

    as_user(b, member_b)

    def member_a() -> tuple[str | None, str]:
        store = Store.in_home(home)
        return (
            harness.store.standins.standin_for(store, interpreter),
            harness.store.standins.standin_reason(store, interpreter),
        )

    assert as_user(a, member_a) == (None, "")
