"""``harness store verify --check-contents`` hashes before the CLI loads (harness.entry,
harness.store.early): the reader takes only command lines it fully knows, and the CLI's verify
takes a digest over only while the path is, entry for entry, what was hashed — every change
made after the early hashing is still found."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.store import early, fingerprint
from harness.store.hashing import nar_digest
from harness.store.store import FIXED_MTIME, BuildResult, Store, remove_tree
from harness.store.verify import verify_store

NAME = "0" * 32 + "-weights"


def _tree(out: Path) -> BuildResult:
    (out / "sub").mkdir(parents=True)
    (out / "a.bin").write_bytes(os.urandom(3 << 20))  # mmap'ed by the hashing (>= 1 MiB)
    (out / "sub" / "b.txt").write_text("hello\n")
    (out / "link").symlink_to("a.bin")
    return BuildResult(obtained="test")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    Store.in_home(tmp_path / "home").add(NAME, "weights", _tree)
    return tmp_path / "home"


@pytest.fixture
def not_recent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths made a moment ago count as old enough to hash early (tests cannot wait 2 s)."""
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)


@pytest.fixture(autouse=True)
def _nothing_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early, "_STARTED", {})


def _hashed_early(home: Path, names: list[str]) -> None:
    """Start the early hashing and wait until it is done, as a slow CLI would."""
    assert early.start_hashing(home, names) == 1
    for job in early._STARTED.values():
        job.wait()


def test_the_entry_point_reads_only_verify_command_lines_it_fully_knows() -> None:
    """Pure: what harness.entry hashes early for, and what it leaves to the CLI."""
    from harness.entry import parse_verify_call

    assert parse_verify_call(["store", "verify", "--check-contents", "x", "y"]) == (
        {},
        {"--check-contents"},
        ["x", "y"],
    )
    assert parse_verify_call(["--home", "/h", "store", "verify", "--json", "--repair", "--", "-x"]) == (
        {"--home": "/h"},
        {"--json", "--repair"},
        ["-x"],
    )
    for argv in (
        ["store", "verify", "--check-contents", "--help"],
        ["store", "verify", "--bogus"],
        ["store", "ls"],
        ["verify"],
        ["--version", "store", "verify"],
        ["store"],
    ):
        assert parse_verify_call(argv) is None, argv


def test_the_entry_point_knows_every_option_of_store_verify() -> None:
    """harness.entry spells verify's options out (it must not import click); a new option in
    the CLI must be taught to it, or a verify using it would never hash early."""
    from harness import entry
    from harness.cli.commands.store import verify

    assert {o for p in verify.params for o in p.opts if o.startswith("-")} == set(entry.VERIFY_FLAGS)
    assert all(getattr(p, "is_flag", False) for p in verify.params if any(o.startswith("-") for o in p.opts))


def test_a_digest_hashed_early_is_taken_over_while_the_path_is_unchanged(home: Path, not_recent: None) -> None:
    path = Store.in_home(home).path(NAME)
    _hashed_early(home, [NAME])
    assert early.take_digest(path) == nar_digest(path)
    assert early.take_digest(path) is None, "each digest is handed over once"
    _hashed_early(home, [])  # no names: every registered path, as the CLI verifies them
    assert [f.status for f in verify_store(Store.in_home(home), check_contents=True)] == ["ok"]
    assert early._STARTED == {}


def _rewrite(path: Path) -> None:
    """Same size, same (fixed) mtime, one byte different: only ctime tells."""
    data = path / "a.bin"
    data.chmod(0o644)
    content = bytearray(data.read_bytes())
    content[1000] ^= 1
    data.write_bytes(bytes(content))
    data.chmod(0o444)
    os.utime(data, ns=(FIXED_MTIME * 10**9, FIXED_MTIME * 10**9))


def _replace(path: Path) -> None:
    """Another file renamed over the one hashed (a new inode, the same size and mtime)."""
    os.chmod(path, 0o755)
    (path / "new").write_bytes((path / "sub" / "b.txt").read_bytes().upper())
    os.utime(path / "new", ns=(FIXED_MTIME * 10**9, FIXED_MTIME * 10**9))
    os.chmod(path / "sub", 0o755)
    os.rename(path / "new", path / "sub" / "b.txt")


def _add(path: Path) -> None:
    os.chmod(path / "sub", 0o755)
    (path / "sub" / "extra").write_text("")


def _make_executable(path: Path) -> None:
    (path / "sub" / "b.txt").chmod(0o555)


@pytest.mark.parametrize("change", [_rewrite, _replace, _add, _make_executable])
def test_a_change_after_the_early_hashing_is_still_found(
    home: Path, not_recent: None, change: Callable[[Path], None]
) -> None:
    store = Store.in_home(home)
    _hashed_early(home, [NAME])
    change(store.path(NAME))
    [finding] = verify_store(store, check_contents=True, names=[NAME])
    assert finding.status == "modified", finding


def test_a_path_changed_moments_before_is_not_hashed_early(home: Path) -> None:
    """Its newest ctime is within RACY_NS: a second change in the same clock tick would not
    show in the listing, so the CLI hashes it itself."""
    path = Store.in_home(home).path(NAME)
    _hashed_early(home, [NAME])
    assert early.take_digest(path) is None
    _hashed_early(home, [NAME])
    _rewrite(path)
    assert verify_store(Store.in_home(home), check_contents=True, names=[NAME])[0].status == "modified"


def test_names_the_cli_reports_are_not_hashed(home: Path) -> None:
    assert early.start_hashing(home, ["9" * 32 + "-unregistered", "../escape", ".meta", "x"]) == 0
    assert early.start_hashing(home / "nowhere", []) == 0
    assert early._STARTED == {}


def _on_exit(line: str) -> str:
    """Python run by the probes below: write ``line`` (an f-string) to stderr as the process
    ends, whether through the CLI (``finally``) or through the verify without it, which leaves
    with ``os._exit`` and so runs no ``finally`` block."""
    return (
        "import os, sys\n"
        f"def report():\n    sys.stderr.write(f'{line}\\n'); sys.stderr.flush()\n"
        "def leave(status, _exit=os._exit):\n    report(); _exit(status)\n"
        "os._exit = leave\n"
    )


_ENTRY = (
    "import sys; import harness.store.early as e; import harness.store.fingerprint as f; f.RACY_NS = 0\n"
    + _on_exit('left {len(e._STARTED)} click {"click" in sys.modules}')
    + "from harness.entry import main\n"
    "try:\n    main()\nfinally:\n    report()\n"
)


def test_the_console_entry_point_hashes_early_and_the_cli_takes_it_over(home: Path) -> None:
    """Through a real process: ``harness store verify --check-contents`` starts hashing before
    click is loaded, the CLI's verify uses that digest, and a corrupt path still fails."""
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from harness.entry import start_early; n = start_early(sys.argv[1:]); "
            "print(n, 'click' in sys.modules, 'pydantic' in sys.modules)",
            "--home",
            str(home),
            "store",
            "verify",
            "--check-contents",
            NAME,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert started.stdout.split() == ["1", "False", "False"], started.stderr

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _ENTRY, "--home", str(home), "store", "verify", "--check-contents", NAME],
            capture_output=True,
            text=True,
            timeout=120,
        )

    clean = verify()
    assert (clean.returncode, clean.stdout.split()) == (0, ["ok", NAME]), clean.stderr
    assert "left 0 click False" in clean.stderr, "the verify took the early digest over, without click"
    _rewrite(Store.in_home(home).path(NAME))
    damaged = verify()
    assert damaged.returncode == 1 and damaged.stdout.startswith(f"modified  {NAME}: expected blake3:"), damaged


def test_a_verify_that_fails_while_the_early_hashing_runs_reports_as_before(home: Path) -> None:
    """The CLI stops at an unreadable record before the path hashed early is taken over: the
    error is the CLI's own, with its exit code, and the hashing thread does not hold up the exit."""
    bad = "1" * 32 + "-broken"
    (home / "store" / ".meta" / f"{bad}.json").write_text("{not json")
    (home / "store" / bad).mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), "store", "verify", "--check-contents", NAME, bad],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stderr.startswith(f"error: store record {home}"), result
    assert "Traceback" not in result.stderr


def test_verify_without_click_prints_what_the_cli_prints(home: Path, tmp_path: Path) -> None:
    """``harness store verify`` runs without click or the CLI (harness.entry.verify_without_cli):
    for clean, modified, missing and unknown paths, with and without --check-contents and
    --json, it prints the CLI's words and exits with its status; --repair is left to the CLI."""
    store = Store.in_home(home)
    gone = "2" * 32 + "-gone"
    store.add(gone, "weights", _tree)
    remove_tree(store.path(gone))
    _rewrite(store.path(NAME))
    empty = tmp_path / "empty-home"
    probe = (
        "import sys, harness.entry as e\n"
        + _on_exit('click {"click" in sys.modules}')
        + "if sys.argv[1] == 'cli': e.verify_without_cli = lambda argv: None\n"
        "sys.argv[1:2] = []\n"
        "try:\n    e.main()\n"
        "finally:\n    report()\n"
    )
    for args in (
        ["store", "verify"],
        ["store", "verify", "--check-contents"],
        ["store", "verify", "--check-contents", "--json"],
        ["store", "verify", "--json", NAME, "9" * 32 + "-unknown"],
        ["store", "verify", "--check-contents", "--", NAME],
    ):
        for where in (home, empty):
            runs = {
                way: subprocess.run(
                    [sys.executable, "-c", probe, way, "--home", str(where), *args],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                for way in ("direct", "cli")
            }
            direct, cli = runs["direct"], runs["cli"]
            assert (direct.returncode, direct.stdout) == (cli.returncode, cli.stdout), (args, direct, cli)
            assert direct.stderr == "click False\n" and cli.stderr == "click True\n", (args, direct, cli)
            assert direct.stdout.strip(), args
    full = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), "store", "verify", "--check-contents"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert full.returncode == 1
    assert f"modified  {NAME}: expected blake3:" in full.stdout and f"missing   {gone}" in full.stdout
    repair = subprocess.run(
        [sys.executable, "-c", probe, "direct", "--home", str(home), "store", "verify", "--repair", NAME],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert repair.stderr.endswith("click True\n"), "--repair realizes: the CLI's to do"
