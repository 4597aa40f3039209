"""The store's notes of which host interpreter copy stands in for a lock's own interpreter.

``store/.standins/<interpreter store name>`` holds ``{"host": <host copy's store name>,
"reason": <why the lock's own could not be had>}`` (JSON, written atomically): plain files
beside the paths, like the rest of the store's bookkeeping. What a stand-in is and when
realize makes one: ``harness/realize/standin.py``.
"""

from __future__ import annotations

import json

from harness.store.store import Store

#: The store's folder of stand-in notes.
STANDINS = ".standins"


def standin_for(store: Store, python_store: str) -> str | None:
    """The registered host copy standing in for interpreter ``python_store`` here, or None."""
    name = _read(store, python_store).get("host", "")
    return name if name and "/" not in name and store.is_registered(name) else None


def standin_reason(store: Store, python_store: str) -> str:
    """Why a host copy stands in for ``python_store`` (as realize last found it), or ""."""
    return _read(store, python_store).get("reason", "")


def remember_standin(store: Store, python_store: str, host_store: str, reason: str) -> None:
    """Note that ``host_store`` stands in for ``python_store`` in this store, and why."""
    from harness.store.entries import BadEntry, write_entry

    folder = store.root / STANDINS
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"host": host_store, "reason": reason}, sort_keys=True) + "\n"
    try:  # never through a link another member planted; theirs to replace in a sticky folder
        write_entry(folder / python_store, data.encode("utf-8"))
    except BadEntry as exc:
        import sys

        print(f"warning: {exc.message} (the stand-in is found again next time)", file=sys.stderr)


def forget_standin(store: Store, python_store: str, host_store: str) -> None:
    """Drop the note that ``host_store`` stands in for ``python_store``, if it says so (the
    copy is being deleted again: the realize that registered it failed); a note naming
    another copy stays."""
    if _read(store, python_store).get("host") == host_store:
        (store.root / STANDINS / python_store).unlink(missing_ok=True)


def _read(store: Store, python_store: str) -> dict[str, str]:
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, _ = read_entry(store.root / STANDINS / python_store)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, BadEntry, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
