"""Reading the state folder's logs (harness/runtime/logs.py) on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import InputError
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


def test_log_files_lists_the_broker_first_and_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    for name in ("seg", "broker", "policy"):
        (tmp_path / "logs" / f"{name}.log").write_text("")
    assert list(log_files(tmp_path, [])) == ["broker", "policy", "seg"]
    assert list(log_files(tmp_path, ["seg"])) == ["seg"]
    with pytest.raises(InputError, match="no log for nope .* broker, policy, seg"):
        log_files(tmp_path, ["nope"])
    assert log_files(tmp_path / "empty", []) == {}
