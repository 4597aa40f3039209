"""Whose registrations a member of a shared store uses.

In a home a group shares (``harness/store/shared.py``) every member can register paths, and a
path is used by everyone who realizes or runs a lock naming it. A member who registers a
path under a lock's name with bytes of their own would otherwise have the others run them.
So trust is explicit, and it is by **who registered** a path, which the file system itself
proves on this machine: a registered path and its record are owned by the member who made
them, read-only, in sticky folders (only that member or root can replace them), and no
unprivileged user can make a file owned by someone else. That is what a signature would say
about a local path, without keys to hand around (binary caches, which cross machines, are
signed: ``harness/cache/``).

A member uses a registered path only when both the path and its record belong to a member
this user trusts: themself, root, the store folder's owner (who made the shared home), and
the members the store's owner lists in ``store/.trusted`` (``harness store trust NAME``;
JSON ``{"version": 1, "members": [login names]}``, honoured only when that file is a regular
file owned by the store folder's owner and not writable by the group). A path registered by
anyone else is, for this user, not registered: realize would build it, and since the sticky
store does not let this user replace another's path, it is refused with a message naming the
path and its owner (:func:`untrusted_message`). A private store (not setgid) trusts its
writers: only its owner can write there.

Except where the lock itself says what the bytes must be. A **fixed-output** path (a wheel or
an sdist, by its sha256; a weight set, by each file's path, size and sha256) that another
member registered is checked by realize against the lock the first time this user needs it
(``harness/realize/members.py``) and, when it holds exactly those bytes and its record's
content hash is theirs, *vouched* for: ``store/.vouched/<uid>/<name>`` (this user's folder,
this user's file) keeps the content hash this user checked. A vouched path counts as
registered for this user while its record still claims that content (a record its owner
rewrote is not vouched for any more); its bytes are then held to that content by the launch
check's stat fingerprints and re-hash, as every path's are. So a lab's members share 30 GB of
weights without trusting one another, and nobody runs code another registered unless they
trust them.

A **derived** path (an interpreter, an environment, code) another member registered is
built by this user all the same when needed, and theirs is used only when it is exactly
this user's own build (the same content hash, and their path holds it: Nix's ``--check``),
then vouched for likewise (:meth:`harness.store.store.Store.add`); a different one is
refused naming the path, its owner and both hashes. So untrusted members cost a build,
never a wrong byte.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

#: The store owner's list of members everyone trusts, inside the store folder.
TRUST_FILE = ".trusted"
#: Per user: the fixed-output paths of other members this user checked (module doc).
VOUCHED_DIR = ".vouched"
_VERSION = 1


class Trust:
    """The uids whose registrations this process uses in one store (module doc)."""

    def __init__(self, store_root: Path) -> None:
        self.root = store_root
        self._uids: frozenset[int] | None = None
        self._shared: bool | None = None

    @property
    def shared(self) -> bool:
        if self._shared is None:
            try:
                self._shared = bool(os.stat(self.root).st_mode & stat.S_ISGID)
            except OSError:
                self._shared = False
        return self._shared

    def uids(self) -> frozenset[int]:
        """Every uid trusted here (for a private store: only meaningful when shared)."""
        if self._uids is None:
            trusted = {os.geteuid(), 0}
            try:
                owner = os.stat(self.root).st_uid
                trusted.add(owner)
            except OSError:
                owner = None
            if owner is not None:
                trusted.update(listed_members(self.root, owner))
            self._uids = frozenset(trusted)
        return self._uids

    def trusts(self, uid: int) -> bool:
        return not self.shared or uid in self.uids()


def listed_members(store_root: Path, owner: int) -> set[int]:
    """The uids ``store/.trusted`` lists, when the store's owner wrote it (module doc)."""
    from harness.store.entries import BadEntry, read_entry

    try:
        data, st = read_entry(store_root / TRUST_FILE, limit=1 << 16)
    except (FileNotFoundError, BadEntry):
        return set()
    if st.st_uid != owner or st.st_mode & 0o022:
        return set()  # not the owner's, or others could have changed it: not a list of theirs
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return set()
    members = document.get("members") if isinstance(document, dict) else None
    uids: set[int] = set()
    for member in members if isinstance(members, list) else []:
        if isinstance(member, str):
            try:
                uids.add(pwd.getpwnam(member).pw_uid)
            except KeyError:
                continue
    return uids


def read_members(store_root: Path) -> list[str]:
    """The login names ``store/.trusted`` lists (as written; empty without the file)."""
    from harness.store.entries import BadEntry, read_entry

    try:
        data, _ = read_entry(store_root / TRUST_FILE, limit=1 << 16)
        document = json.loads(data.decode("utf-8"))
    except (FileNotFoundError, BadEntry, UnicodeDecodeError, ValueError, RecursionError):
        return []
    members = document.get("members") if isinstance(document, dict) else None
    return sorted(m for m in members if isinstance(m, str)) if isinstance(members, list) else []


def write_members(store_root: Path, members: list[str]) -> None:
    """Write ``store/.trusted`` (0644, atomically; the caller must own the store folder)."""
    from harness.store.entries import write_entry

    text = json.dumps({"version": _VERSION, "members": sorted(set(members))}, indent=1) + "\n"
    write_entry(store_root / TRUST_FILE, text.encode("utf-8"), mode=0o644)


def untrusted_message(path: Path, uid: int) -> str:
    """Why this user does not use ``path`` (registered by ``uid``), and what to do."""
    from harness.store.entries import user_name

    who = user_name(uid)
    return (
        f"{path} was registered by {who}, whom you do not trust in this shared store, so harness does not use it; "
        f"only {who} (or root) can remove it. The store's owner can trust {who} (`harness store trust {who}`)"
    )


def _vouch_file(store_root: Path, name: str) -> Path:
    return store_root / VOUCHED_DIR / str(os.geteuid()) / name


#: Checks this process made but could not write down (another member planted an entry where
#: this user's note goes): remembered here, so this command goes on; the next one checks again.
_CHECKED: dict[tuple[str, str], str] = {}


def vouched(store_root: Path, name: str) -> str | None:
    """The content hash this user checked ``name`` against its lock for, or None."""
    from harness.store.entries import BadEntry, read_entry

    remembered = _CHECKED.get((os.fspath(store_root), name))
    if remembered is not None:
        return remembered
    try:
        data, st = read_entry(_vouch_file(store_root, name), limit=4096)
    except (FileNotFoundError, BadEntry):
        return None
    if st.st_uid != os.geteuid():
        return None
    text = data.decode("utf-8", errors="replace").strip()
    return text if text.startswith("blake3:") else None


def vouch(store_root: Path, name: str, content: str) -> None:
    """Remember that this user checked ``name`` (holding ``content``) against its lock: in
    this user's folder of notes; where another member planted something in its way, for
    this process only (a warning says so: later commands check again)."""
    import sys

    from harness.store.entries import BadEntry, own_folder, write_entry

    _CHECKED[(os.fspath(store_root), name)] = content
    folder = _vouch_file(store_root, name).parent
    try:
        write_entry(own_folder(folder, "checked paths") / name, (content + "\n").encode("utf-8"), mode=0o644)
    except (OSError, BadEntry) as exc:
        print(f"warning: cannot note that {name} was checked ({exc}); it is checked again next time", file=sys.stderr)
