"""Reading the state folder's logs (harness/runtime/logs.py) on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import InputError
from harness.runtime import supervisor
from harness.runtime.logs import Follower, last_lines, log_files


def test_last_lines_reads_backwards_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert last_lines(log, 3, block=16) == ["line 997", "line 998", "line 999"]
    assert last_lines(log, 0) == [] and last_lines(tmp_path / "missing.log", 5) == []
    assert len(last_lines(log, 5000)) == 1000


def test_follower_hands_out_complete_lines_and_rereads_a_truncated_log(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("old\n")
    follower = Follower({"svc": log, "late": tmp_path / "late.log"})
    assert follower.poll() == []
    with open(log, "a") as handle:
        handle.write("new line\nhalf")
    assert follower.poll() == [("svc", "new line")], "half a line waits for its end"
    with open(log, "a") as handle:
        handle.write(" done\n")
    assert follower.poll() == [("svc", "half done")]
    log.write_text("after truncation\n")
    assert follower.poll() == [("svc", "after truncation")]
    (tmp_path / "late.log").write_text("appeared\n")
    assert follower.poll() == [("late", "appeared")], "a log that appears later is read from its start"


def test_a_log_over_the_limit_is_moved_aside_when_its_writer_starts(tmp_path: Path) -> None:
    """Rotation at each start: the old log becomes NAME.log.1 (replacing an older one, and a
    link planted there is replaced, its target untouched); the new log starts empty, 0600;
    `harness logs` lists only NAME.log, and a follower reads the new file from its start."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "svc.log"
    log.write_text("x" * 100 + "\n")
    follower = Follower({"svc": log})
    target = tmp_path / "elsewhere"
    target.write_text("not a log\n")
    (logs / "svc.log.1").symlink_to(target)
    with supervisor.open_private_log(log, rotate_bytes=50) as out:
        out.write(b"after the restart\n")
    assert (logs / "svc.log.1").read_text() == "x" * 100 + "\n" and not (logs / "svc.log.1").is_symlink()
    assert target.read_text() == "not a log\n"
    assert log.read_text() == "after the restart\n" and log.stat().st_mode & 0o777 == 0o600
    assert follower.poll() == [("svc", "after the restart")]
    assert list(log_files(tmp_path, [])) == ["svc"]
    with supervisor.open_private_log(log, rotate_bytes=50) as out:  # under the limit: appended
        out.write(b"again\n")
    assert log.read_text() == "after the restart\nagain\n"


def test_a_replaced_log_that_outgrew_the_old_offset_is_still_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("first\n")
    follower = Follower({"svc": log})
    fresh = tmp_path / "fresh.log"
    fresh.write_text("one\ntwo\nthree\n")  # longer than the old file: size alone cannot tell
    fresh.replace(log)
    assert follower.poll() == [("svc", "one"), ("svc", "two"), ("svc", "three")]


def test_log_files_lists_the_broker_first_and_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    for name in ("seg", "broker", "policy"):
        (tmp_path / "logs" / f"{name}.log").write_text("")
    assert list(log_files(tmp_path, [])) == ["broker", "policy", "seg"]
    assert list(log_files(tmp_path, ["seg"])) == ["seg"]
    with pytest.raises(InputError, match="no log for nope .* broker, policy, seg"):
        log_files(tmp_path, ["nope"])
    assert log_files(tmp_path / "empty", []) == {}
