"""The store's notes of which host interpreter copy stands in for a lock's own interpreter.

``store/.standins/<uid>/<interpreter store name>`` holds ``{"host": <host copy's store
name>, "reason": <why the lock's own could not be had>}`` (JSON, written atomically): plain
files beside the paths, like the rest of the store's bookkeeping, in a folder of the user who
wrote them. What a stand-in is and when realize makes one: ``harness/realize/standin.py``.

In a shared home every member realizes, and each member's host Python may differ (another
release, another copy): one note for all would let the first member's note (sticky: only
they can replace it) stand in the way of everyone else's, and a note another member planted
would leave a member without an interpreter. So a member reads their own note first, then
any other note (another member's, or the one folder-less note older harness versions wrote)
whose copy is registered *for them* (:meth:`harness.store.store.Store.is_registered`: made
by a member they trust, or checked to be their own build). A note only points at a path;
the path's own trust is what lets it be used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.store.store import Store

#: The store's folder of stand-in notes.
STANDINS = ".standins"


def standin_for(store: Store, python_store: str) -> str | None:
    """The registered host copy standing in for interpreter ``python_store`` here, or None."""
    note = _chosen(store, python_store)
    return note.get("host") if note else None


def standin_reason(store: Store, python_store: str) -> str:
    """Why a host copy stands in for ``python_store`` (as realize last found it), or ""."""
    note = _chosen(store, python_store) or _read(_own_folder(store) / python_store, os.geteuid())
    return note.get("reason", "")


def remember_standin(store: Store, python_store: str, host_store: str, reason: str) -> None:
    """Note that ``host_store`` stands in for ``python_store`` in this store, and why: in this
    user's folder of notes (where another member planted something in its way, a warning
    says so, and the stand-in is found again next time)."""
    import sys

    from harness.store.entries import BadEntry, own_folder, write_entry

    data = json.dumps({"host": host_store, "reason": reason}, sort_keys=True) + "\n"
    try:
        write_entry(own_folder(_own_folder(store), "stand-in notes") / python_store, data.encode("utf-8"))
    except (OSError, BadEntry) as exc:
        print(
            f"warning: cannot note the stand-in for {python_store} ({exc}); it is found again next time",
            file=sys.stderr,
        )


def forget_standin(store: Store, python_store: str, host_store: str) -> None:
    """Drop this user's note that ``host_store`` stands in for ``python_store``, if it says so
    (the copy is being deleted again: the realize that registered it failed); a note naming
    another copy stays."""
    path = _own_folder(store) / python_store
    if _read(path).get("host") == host_store:
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # the folder this realize made for it, when it holds no other note
        except OSError:
            pass


def _own_folder(store: Store) -> Path:
    return store.root / STANDINS / str(os.geteuid())


def _chosen(store: Store, python_store: str) -> dict[str, str] | None:
    """The first note, this user's own first (module doc), whose host copy is registered for
    this user; None when there is none."""
    folder = store.root / STANDINS
    own = _own_folder(store)
    try:
        others = sorted(p for p in folder.iterdir() if p.name.isdigit() and p != own)
    except OSError:
        others = []
    me = os.geteuid()
    # Each note is believed only from the member its folder is named for (a note another
    # member planted in one's own folder, or one's own folder made by another, says nothing),
    # and only for a host copy of an interpreter registered for this user.
    notes = [
        (own / python_store, me, True),
        *((p / python_store, int(p.name), True) for p in others),
        (folder / python_store, me, False),  # an older harness's note, not in a folder of its own
    ]
    for path, writer, in_own_folder in notes:
        note = _read(path, writer, in_own_folder=in_own_folder)
        name = note.get("host", "")
        if name and "/" not in name and store.is_registered(name) and _interpreter(store, name):
            return note
    return None


def _interpreter(store: Store, name: str) -> bool:
    record = store.record(name)
    return record is not None and record.kind == "python"


def _read(path: Path, writer: int | None = None, *, in_own_folder: bool = True) -> dict[str, str]:
    """A note's fields; {} for anything else there, or (``writer``) a note that user (or
    root) did not write, in a folder of theirs unless not ``in_own_folder``."""
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, st = read_entry(path)
        if writer is not None and (
            st.st_uid not in (writer, 0) or (in_own_folder and os.lstat(path.parent).st_uid not in (writer, 0))
        ):
            return {}
        data = json.loads(raw.decode("utf-8"))
    except (OSError, BadEntry, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
