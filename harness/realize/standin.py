"""A host interpreter standing in for a lock's own: its store path, and the lock as realized here.

Every lock names the interpreter it is built on (``[python] store``), normally a uv-managed
CPython that realize installs through uv anywhere, byte for byte. When uv cannot provide it
(no network and no cache holds it, downloads forbidden, or a ``source = "host"`` lock whose
version uv has no download for), realize copies an installed CPython of the same version
instead. That copy is **not** the lock's interpreter, so it never takes the lock's name:

* it is registered under a name of its own, fixed by its content
  (:func:`harness.lock.storepaths.host_interpreter_path`, ``<hash>-cpython-3.11.7-host``), with
  ``impure = "host: <copied executable>"`` in its record;
* the environment built on it is the lock's environment with that interpreter
  (:func:`harness.lock.storepaths.with_interpreter`): another path;
* the store remembers, per lock interpreter, which host copy stands in for it on this machine
  and why (``store/.standins/<uid>/<lock interpreter name>``, ``harness/store/standins.py``). The
  runtime, run records, ``store path`` and ``services`` read it through :func:`realized_lock`;
  ``gc`` keeps a stand-in and its environments alive while they stand in.

The lock's own interpreter always wins: once it is registered (installed through uv, or
pulled from a binary cache), :func:`realized_lock` returns the lock itself and the stand-in is
only garbage for ``gc``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.store.standins import standin_for, standin_reason
from harness.store.store import Store

if TYPE_CHECKING:
    from harness.lock.document import Lock


def own_interpreter_registered(store: Store, lock: Lock) -> bool:
    """Whether the lock's own interpreter is registered (a ``source = "host"`` lock's never is).

    A record under the lock's name that says ``impure`` is a host copy that an older harness
    registered under the canonical name: it does not count (realize replaces it)."""
    if lock.python.source != "uv-managed":
        return False
    record = store.record(lock.python.store)
    return record is not None and not record.impure


def realized_lock(store: Store, lock: Lock) -> Lock:
    """``lock`` as this store realizes it: the lock itself when its own interpreter is
    registered (or when nothing stands in for it: then it is simply not realized yet), else
    the lock with the host copy standing in and the environment built on that copy."""
    from harness.lock.storepaths import with_interpreter

    if own_interpreter_registered(store, lock):
        return lock
    host = standin_for(store, lock.python.store)
    return with_interpreter(lock, host) if host else lock


def standin_note(store: Store, lock: Lock, realized: Lock) -> str:
    """One line for reports: which host copy stands in for the lock's interpreter, and why."""
    record = store.record(realized.python.store)
    what = f" ({record.impure})" if record is not None and record.impure else ""
    reason = standin_reason(store, lock.python.store)
    return (
        f"host interpreter {realized.python.store}{what} stands in for the lock's {lock.python.store}"
        + (f": {reason}" if reason else "")
        + f"; environment {realized.environment.store}"
    )
