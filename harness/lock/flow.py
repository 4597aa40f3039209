"""What ``harness lock`` does, without the shell: its ``--check`` and its lock, each answered
from the stamps (:mod:`harness.lock.stamp`) before any model loads when no input changed.

Light on purpose: the CLI imports it for every ``harness lock``, and the no-op answers must
load neither pydantic nor a resolver. What a flow needs past the stamps is imported inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.lock.outcome import LockOptions, Outcome

if TYPE_CHECKING:
    from harness.lock.check import Staleness
    from harness.manifests.project import Project


def stale_locks(home: Path, project: Project, names: list[str], *, platform: str | None = None) -> list[Staleness]:
    """Every named lock (all when none) that is missing or stale, with the reason; with
    ``platform`` (``lock --check --platform P``), a lock not made for P is stale too, and a
    platform harness cannot lock for is refused (InputError, naming the accepted spellings).

    Empty, without loading any model, when every named lock is as the last lock in this home
    wrote it, from inputs none of which changed since; otherwise
    :func:`harness.lock.check.check_locks` against this machine's settings decides."""
    from harness.lock.stamp import LockStamps

    target = None
    if platform is not None:
        from harness.errors import InputError
        from harness.resolve.interpreter import parse_platform

        try:
            target = parse_platform(platform).platform
        except InputError as exc:
            raise InputError(f"--platform: {exc.message}", hint=exc.hint) from None
    if target is None and LockStamps(home / "cache", project, platform=None).quick(names) is not None:
        return []
    from harness.config import load_settings
    from harness.lock.check import check_locks

    return check_locks(project, names, settings=load_settings(home, project.root), platform=target)


def unchanged_outcomes(home: Path, project: Project, names: list[str], options: LockOptions) -> list[Outcome] | None:
    """The outcomes of a lock with nothing to do, answered from the stamps before any model
    loads; None when it must take the full path (:func:`lock_with_early_runs`): an input
    changed, or ``options`` resolve anyway."""
    if options.resolves_anyway:
        return None
    from harness.lock.stamp import LockStamps

    return LockStamps(home / "cache", project, platform=options.platform).quick(names)


def lock_with_early_runs(
    home: Path,
    project: Project,
    names: list[str],
    options: LockOptions,
    *,
    on_done: Callable[[Outcome], None],
    status: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> list[Outcome]:
    """The full path: start uv's resolutions from the raw manifests
    (:mod:`harness.lock.early`), then load the models, validate, and lock
    (:func:`harness.lock.generate.lock_project`), taking over those runs where they match.

    ``on_done`` is called with each manifest's outcome as it finishes; the locking runs inside
    ``status()`` (a spinner on a terminal), entered once the settings are loaded. Runs started
    early that no lock took over are stopped on the way out, whatever happened."""
    from harness.lock.early import prestart_locks
    from harness.resolve.uvtool import discard_prestarted

    try:
        prestart_locks(home, project, names, options)
        from harness.config import load_settings
        from harness.lock.generate import lock_project

        settings = load_settings(home, project.root)
        with status():
            return lock_project(
                project, names, settings=settings, cache_dir=home / "cache", options=options, on_done=on_done
            )
    finally:
        discard_prestarted()
