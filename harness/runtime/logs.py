"""The logs of a state folder's services and broker (``harness logs``): their last lines, and
the lines written since, as ``tail -n`` and ``tail -F`` read them.

Every service's output goes to ``<state>/logs/NAME.log`` (appended across restarts) and a
detached broker's to ``logs/broker.log``. :func:`log_files` finds them, :func:`last_lines`
reads the end of one without reading it whole, and :class:`Follower` hands out complete
lines as they are written, from where it started; a file that shrank (truncated) is read
again from its start, as is one replaced by a new file (a log moved aside to ``NAME.log.1``
when its writer restarts over :data:`harness.runtime.supervisor.LOG_ROTATE_BYTES`), and one
that appears later is followed from its first line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import InputError

#: The broker's own log, beside the services'.
BROKER_LOG = "broker"


def log_files(state_dir: Path, names: list[str]) -> dict[str, Path]:
    """``name → <state>/logs/<name>.log`` for ``names`` (every log there, sorted, the broker's
    first, when none is named). A name with no log is an :class:`InputError` naming the
    folder and the logs it holds."""
    folder = Path(state_dir) / "logs"
    present = sorted(p.stem for p in folder.glob("*.log")) if folder.is_dir() else []
    if not names:
        ordered = sorted(present, key=lambda n: (n != BROKER_LOG, n))
        return {n: folder / f"{n}.log" for n in ordered}
    missing = [n for n in names if n not in present]
    if missing:
        known = ", ".join(present) or "none yet"
        raise InputError(
            f"no log for {', '.join(missing)} in {folder} (logs there: {known})",
            hint="a service has a log once harness has started it; harness status lists the services",
        )
    return {n: folder / f"{n}.log" for n in names}


def last_lines(path: Path, count: int, *, block: int = 1 << 16) -> list[str]:
    """The last ``count`` lines of ``path`` (without their newlines), reading backwards from
    its end a block at a time; [] when it is missing or ``count`` is 0."""
    if count <= 0:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            position = handle.tell()
            data = b""
            while position > 0 and data.count(b"\n") <= count:
                step = min(block, position)
                position -= step
                handle.seek(position)
                data = handle.read(step) + data
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]


@dataclass
class Follower:
    """Complete lines appended to a set of logs since it started (:meth:`poll`)."""

    paths: dict[str, Path]
    from_start: bool = False  # True: follow from each file's first byte, not its end
    _offsets: dict[str, int] = field(default_factory=dict)
    _partial: dict[str, bytes] = field(default_factory=dict)
    _files: dict[str, int] = field(default_factory=dict)  # the inode each offset belongs to

    def __post_init__(self) -> None:
        for name, path in self.paths.items():
            size, self._files[name] = _size(path)
            self._offsets[name] = 0 if self.from_start else size

    def poll(self, max_bytes: int = 1 << 20) -> list[tuple[str, str]]:
        """``(name, line)`` for each line completed since the last poll, log by log."""
        out: list[tuple[str, str]] = []
        for name, path in self.paths.items():
            size, inode = _size(path)
            offset = self._offsets.get(name, 0)
            if size < offset or inode != self._files.get(name):  # truncated or replaced: from its start
                offset, self._partial[name] = 0, b""
                self._files[name] = inode
            if size == offset:
                continue
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(min(size - offset, max_bytes))
            except OSError:
                continue
            self._offsets[name] = offset + len(data)
            data = self._partial.pop(name, b"") + data
            *complete, rest = data.split(b"\n")
            if rest:
                self._partial[name] = rest
            out += [(name, line.decode("utf-8", errors="replace")) for line in complete]
        return out


def _size(path: Path) -> tuple[int, int]:
    """(size, inode) of ``path``; (0, 0) while it is missing."""
    try:
        info = path.stat()
    except OSError:
        return 0, 0
    return info.st_size, info.st_ino
