"""The cache of build backends' answers (harness/resolve/answercache.py): threads of one lock
write the same answer at once without failing, and only this user's own regular file counts."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from harness.resolve.answercache import cached_answer, remember_answer


def test_threads_writing_one_answer_at_once_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "build-requires" / "key.json"
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(50):
                remember_answer(path, ["setuptools>=40.8.0", "wheel"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert cached_answer(path) == ["setuptools>=40.8.0", "wheel"]
    assert [p.name for p in path.parent.iterdir()] == ["key.json"], "no temporary file left"


def test_a_planted_or_broken_answer_is_asked_again(tmp_path: Path) -> None:
    target = tmp_path / "planted.json"
    target.write_text('["evil-backend-helper"]')
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert cached_answer(link) is None  # never through a link
    (tmp_path / "garbage.json").write_bytes(b"\xff{")
    assert cached_answer(tmp_path / "garbage.json") is None
    (tmp_path / "mixed.json").write_text('["ok", 1]')
    assert cached_answer(tmp_path / "mixed.json") is None
    os.mkfifo(tmp_path / "fifo.json")
    assert cached_answer(tmp_path / "fifo.json") is None  # and no hang
    assert cached_answer(tmp_path / "absent.json") is None
    remember_answer(tmp_path / "no-such-dir-file" / "x.json", ["a"])  # a folder it can make
    assert cached_answer(tmp_path / "no-such-dir-file" / "x.json") == ["a"]
    (tmp_path / "blocked").write_text("a file where the folder would be")
    remember_answer(tmp_path / "blocked" / "x.json", ["a"])  # never raises
