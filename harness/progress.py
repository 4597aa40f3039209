"""Progress of long phases on stderr: live on a terminal, plain lines otherwise, or nothing.

The face is small::

    progress = reporter(enabled)               # enabled=False: --quiet
    with progress.phase("compiling bytecode", unit="files") as phase:
        phase.update(done, total)              # or phase.advance(n); thread-safe
        phase.summary = "12.3 MiB"             # optional, said when the phase ends

What it shows depends on where stderr goes, decided once per :func:`reporter` call:

* **live** (stderr is a terminal): one rich display for the whole process, a line per open
  phase (bar, counts, speed for bytes, time); each phase that ends leaves one line behind.
* **plain** (a pipe, a file, CI): a line when a phase starts, one when it ends (counts and
  elapsed time, or that it failed), and in between at most one ``N of M`` line every
  :data:`PLAIN_INTERVAL` seconds, so a long phase shows it is alive without flooding a log.
* **quiet**: nothing.

Progress never goes to stdout, which stays for results and ``--json``. rich is imported only
when a live display is started (``harness --help`` stays light). Phases may nest and may be
advanced from several threads. Nothing here is global state except the one live display,
since a terminal can show one at a time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any, Literal

#: In plain mode, the least time between two lines of the same phase.
PLAIN_INTERVAL = 10.0

Mode = Literal["live", "plain", "quiet"]


def reporter(enabled: bool = True, *, stream: IO[str] | None = None, console: Any = None) -> Reporter:
    """A :class:`Reporter` for stderr (or ``stream``, or a rich ``console``): quiet when not
    ``enabled``, live when the target is a terminal, plain lines otherwise."""
    if not enabled:
        return Reporter("quiet")
    if console is not None:
        return Reporter("live" if console.is_terminal else "plain", stream=console.file, console=console)
    target = stream if stream is not None else sys.stderr
    return Reporter("live" if _is_terminal(target) else "plain", stream=stream)


def _is_terminal(stream: IO[str]) -> bool:
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Reporter:
    """Opens :class:`Phase` s (see the module doc). ``mode`` says how they are shown."""

    def __init__(self, mode: Mode, *, stream: IO[str] | None = None, console: Any = None) -> None:
        self.mode: Mode = mode
        self._stream = stream
        self._console = console

    @property
    def enabled(self) -> bool:
        return self.mode != "quiet"

    def phase(self, label: str, *, total: int | None = None, unit: str = "files") -> Phase:
        """A phase named ``label`` (say what is being done: "compiling bytecode of …"), of
        ``total`` ``unit`` s when known (``"bytes"`` are shown as MiB/GiB). Use it as a
        context manager: it starts on entry and ends on exit (failed, if by an exception)."""
        return Phase(self, label, total, unit)

    def check(self) -> None:
        """Raise :class:`Stopped` when this reporter's work was asked to stop (:meth:`until`);
        a plain reporter never is."""

    def until(self, stop: threading.Event) -> Reporter:
        """This reporter, except that asking it for a phase once ``stop`` is set raises
        :class:`Stopped`: work that became pointless (what realize builds beside a fetch that
        failed) ends at its next phase instead of running to its end."""
        return _Until(self, stop)

    # -- output, by mode

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        write_line(stream, line)

    def _live(self) -> _Live:
        return _Live.for_console(self._console)


class Stopped(BaseException):
    """Raised by :meth:`Reporter.until`'s reporter when a phase is asked for after the stop.

    A BaseException, so that no ``except Exception`` between the phase and whoever set the stop
    takes it for a failure of its own."""


class _Until(Reporter):
    def __init__(self, inner: Reporter, stop: threading.Event) -> None:
        super().__init__(inner.mode, stream=inner._stream, console=inner._console)
        self._stop = stop

    def check(self) -> None:
        if self._stop.is_set():
            raise Stopped("stopped")

    def phase(self, label: str, *, total: int | None = None, unit: str = "files") -> Phase:
        if self._stop.is_set():
            raise Stopped(label)
        phase = super().phase(label, total=total, unit=unit)
        phase._stop = self._stop
        return phase


class Phase:
    """One phase: counts done of an optional total, elapsed time, an optional summary."""

    def __init__(self, owner: Reporter, label: str, total: int | None, unit: str) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        #: Said after the counts when the phase ends (and in plain progress lines).
        self.summary: str | None = None
        #: What an exception out of the phase is called ("unavailable" when a fallback follows).
        self.failure = "failed"
        self._owner = owner
        #: Set by :meth:`Reporter.until`: once it is, the phase's next update or check raises
        #: :class:`Stopped`, so a worker stops within one unit of work, not at the phase's end.
        self._stop: threading.Event | None = None
        self._lock = threading.Lock()
        self._started = 0.0
        self._last_line = 0.0
        self._task: Any = None

    # -- use

    def check(self) -> None:
        """Raise :class:`Stopped` when the realize this phase belongs to was asked to stop
        (an interrupt, a failed fetch): long steps call it between units of work."""
        if self._stop is not None and self._stop.is_set():
            raise Stopped(self.label)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.check()
        with self._lock:
            self.done += n
        self._changed()

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` units done so far (of ``total``, when given: it may be learnt late)."""
        self.check()
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
        self._changed()

    def callback(self) -> Callable[[int, int], None]:
        """``update`` as a plain ``(done, total)`` callable, for code that knows no phases."""
        return lambda done, total: self.update(done, total)

    # -- start and end (a context manager does both)

    def start(self) -> Phase:
        """Show that the phase began; returns the phase."""
        self._started = self._last_line = time.monotonic()
        mode = self._owner.mode
        if mode == "plain":
            self._owner._write(f"{self.label} ...")
        elif mode == "live":
            self._task = self._owner._live().open(self)
        return self

    def finish(self, outcome: str = "done") -> None:
        """Show that the phase ended: with its counts and elapsed time when ``done``, else
        with ``outcome`` ("failed", "interrupted", …) and the time it took."""
        mode = self._owner.mode
        if mode == "quiet":
            return
        elapsed = _seconds(time.monotonic() - self._started)
        if outcome == "done":
            line = f"{self.label}: {self._counts(final=True)}done in {elapsed}"
        else:
            line = f"{self.label}: {outcome} after {elapsed}"
        if mode == "plain":
            self._owner._write(line)
        else:
            self._owner._live().close(self._task, line)

    def __enter__(self) -> Phase:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.finish()
        else:
            self.finish("interrupted" if issubclass(kind, KeyboardInterrupt) else self.failure)

    # -- display

    def _changed(self) -> None:
        mode = self._owner.mode
        if mode == "live":
            if self._task is not None:
                self._owner._live().update(self._task, self)
            return
        if mode != "plain" or self.total is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last_line < PLAIN_INTERVAL or self.done >= self.total:
                return
            self._last_line = now
        self._owner._write(f"{self.label}: {self._counts(final=False)}{_seconds(now - self._started)}")

    def _counts(self, *, final: bool) -> str:
        """``"12 of 40 files, "`` (or bytes; then the summary), ready to precede a time."""
        parts = []
        done, total = self.done, self.total
        if self.unit == "bytes":
            if total is not None and not final:
                parts.append(f"{_bytes(done)} of {_bytes(total)}")
            elif done or total:
                parts.append(_bytes(done or total or 0))
        elif total is not None and done != total:
            parts.append(f"{done} of {total} {_unit(total, self.unit)}")
        elif total is not None or done:
            parts.append(f"{done} {_unit(done, self.unit)}")
        if self.summary:
            parts.append(self.summary)
        return "".join(f"{part}, " for part in parts)


def _unit(n: int, unit: str) -> str:
    """The unit as counted: "files" for most counts, "file" for one."""
    return unit[:-1] if n == 1 and unit.endswith("s") else unit


def format_bytes(n: int) -> str:
    """``n`` bytes for people: KiB, MiB or GiB."""
    return _bytes(n)


def _bytes(n: int) -> str:
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(s % 60)} s"


class _Live:
    """The rich display: one per console (the process's stderr console, or one a caller
    passed), started when its first phase opens and stopped when its last one closes."""

    _lock = threading.Lock()
    _by_console: dict[int, _Live] = {}

    def __init__(self, console: Any) -> None:
        self.console = console
        self.progress: Any = None
        self.open_tasks = 0

    @classmethod
    def for_console(cls, console: Any) -> _Live:
        with cls._lock:
            live = cls._by_console.get(id(console))
            if live is None:
                live = cls._by_console[id(console)] = cls(console)
            return live

    def open(self, phase: Phase) -> Any:
        with self._lock:
            starting = self.progress is None
            if starting:
                self.progress = _make_progress(self.console)
            self.open_tasks += 1
            task = self.progress.add_task(phase.label, total=phase.total, unit=phase.unit, completed=phase.done)
            if starting:  # after the task: the first frame already shows it
                self.progress.start()
            return task

    def update(self, task: Any, phase: Phase) -> None:
        self.progress.update(task, completed=phase.done, total=phase.total)

    def close(self, task: Any, line: str) -> None:
        with self._lock:
            progress = self.progress
            if progress is None:
                return
            progress.remove_task(task)
            # A styled Text, not print(style=…): that style would also tint the live rows
            # rich re-draws below the line.
            from rich.text import Text

            progress.console.print(Text(line, style="dim"))
            self.open_tasks -= 1
            if self.open_tasks == 0:
                progress.stop()
                self.progress = None


def _make_progress(console: Any) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        ProgressColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class ByUnit(ProgressColumn):
        """Counts in the task's unit: bytes as a download, others as "N/M files"."""

        def __init__(self) -> None:
            super().__init__()
            self.download, self.count, self.speed = DownloadColumn(), MofNCompleteColumn(), TransferSpeedColumn()

        def render(self, task: Any) -> Any:
            unit = task.fields.get("unit", "")
            if task.total is None:
                return Text(f"{int(task.completed)} {unit}" if task.completed else "")
            if unit == "bytes":
                return Text.assemble(self.download.render(task), " ", self.speed.render(task))
            return Text.assemble(self.count.render(task), f" {unit}")

    class WhenTotal(ProgressColumn):
        """A column shown only for tasks with a total (a bar, a time left)."""

        def __init__(self, column: ProgressColumn) -> None:
            super().__init__()
            self.column = column

        def render(self, task: Any) -> Any:
            return self.column.render(task) if task.total is not None else Text("")

    from rich.progress import Progress

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        WhenTotal(BarColumn()),
        WhenTotal(TaskProgressColumn()),
        ByUnit(),
        TimeElapsedColumn(),
        WhenTotal(TimeRemainingColumn()),
        console=console if console is not None else Console(stderr=True),
        transient=True,
    )


#: Shows nothing: the default of every function that takes a reporter.
QUIET = Reporter("quiet")

__all__ = ["PLAIN_INTERVAL", "QUIET", "Phase", "Reporter", "format_bytes", "reporter"]


def write_line(stream: IO[str], line: str) -> None:
    """Write ``line`` and its newline in one call, then flush. ``print`` writes the text and
    its end separately, so a line another thread prints between the two (a realize warning
    beside a progress line from a fetch worker) ended up joined to this one."""
    stream.write(f"{line}\n")
    stream.flush()
