"""What ``harness lock`` is asked to do and what it did, per manifest: plain data, no imports
beyond the standard library, so the no-op re-lock (:mod:`harness.lock.stamp`) can answer
without loading the lock models."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: the no-op re-lock answers without the lock models
    from harness.lock.changes import Change
    from harness.lock.document import Lock


@dataclass(frozen=True)
class LockOptions:
    """How to lock: target platform, network use and what may move.

    ``upgrade``, ``upgrade_packages`` and ``refresh`` always resolve again; otherwise a
    manifest none of whose inputs changed since its last lock keeps that lock without
    resolving (:mod:`harness.lock.stamp`)."""

    platform: str | None = None
    offline: bool = False
    upgrade: bool = False
    upgrade_packages: tuple[str, ...] = ()
    jobs: int = 4
    #: Resolve again even when no input changed: an index may have gained or lost files of a
    #: pinned version since (pins still stay unless upgrading).
    refresh: bool = False

    @property
    def resolves_anyway(self) -> bool:
        """Whether these options ask for a resolution even when no input changed."""
        return self.upgrade or bool(self.upgrade_packages) or self.refresh


@dataclass
class Outcome:
    """What happened to one manifest's lock."""

    name: str
    path: Path
    changed: bool = False
    error: str | None = None
    #: The lock (a :class:`harness.lock.document.Lock`); None on error, and when the no-op
    #: path answered before any model was loaded.
    lock: Lock | None = None
    notes: list[str] = field(default_factory=list)
    #: What changed from the previous lock (harness.lock.changes), in order.
    changes: list[Change] = field(default_factory=list)
    #: The store path of the locked environment (this machine's platform's first target).
    environment: str | None = None
    #: Whether the resolvers ran; False when the lock was kept because no input changed.
    resolved: bool = True
