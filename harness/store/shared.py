"""A home shared by a group: ``harness --home DIR store init --group GROUP``.

A lab keeps one copy of each store path per machine (weights are tens of gigabytes) by
giving its members one ``HARNESS_HOME``. The contract, made of plain POSIX permissions so
that it holds on any local filesystem and on NFS:

* every folder of the home belongs to GROUP and is setgid, so whatever a member creates in
  it belongs to GROUP too;
* the CLI clears the group bits of the process umask while it works in a shared home
  (:func:`apply_group_umask`), so what a member creates is group-readable and, where it is
  writable at all (lock files, download folders, uv's cache), group-writable, whatever that
  member's own umask;
* the store folder, its records (``.meta``), its build folders (``.tmp``), its pool of
  shared files (``.links``), its launch-check fingerprints (``.stat``), its lock files
  (``.locks``) and its garbage-collector roots (``.roots``) are sticky, like ``/tmp``: only the member who registered a path
  (or the owner of the folder, or root) can rename or delete it, and registered paths are
  read-only, so no member can modify, rename or delete a path another registered. The
  store refuses such a removal up front with a message naming the owner
  (:meth:`Store.check_removable <harness.store.store.Store.check_removable>`);
* the home itself, ``cache``, ``runs`` and ``state`` are sticky as well (:data:`LAYOUT`): no
  member can rename or delete the layout's folders or another member's cache folders, run
  records, services' state folders or reserved ports (``runs prune`` passes other members'
  records by).

What another member *creates* there (a symlink, a fifo, garbage under a name harness will use)
is opened without being followed and reported as that entry (``harness/store/entries.py``), and
a path another member registered is used only when this user trusts them
(``harness/store/trust.py``). Re-running ``store init --group`` on an older shared home makes
its folders sticky as this version lays them out.

Whether a home is shared is read from the store folder itself (its setgid bit), so every
member's harness agrees without any configuration.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.errors import HarnessError, InputError

#: Folders of a home, relative to it, that ``init`` creates; the sticky ones are marked.
#: The home itself, ``cache``, ``runs`` and ``state`` are sticky too: every member creates
#: entries there (a run record, a cache folder, a state folder), and no member may rename or
#: delete the folders of the layout or another member's entries (``mv cache cache.old``
#: would break every member's commands). ``cache/downloads`` is not: a member must replace another's partial or wrong
#: download there (``harness/download.py``), and what it holds is checked against the lock
#: again as it is taken (``builder.py:_take_download``); the folder itself cannot be moved.
LAYOUT: tuple[tuple[str, bool], ...] = (
    ("", True),
    ("store", True),
    ("store/.meta", True),
    ("store/.tmp", True),
    ("store/.links", True),
    ("store/.stat", True),  # launch-check fingerprints: each member writes its own paths'
    ("store/.vouched", True),  # per member: the other members' fixed-output paths they checked
    ("store/.standins", True),  # which host copy stands in for which interpreter
    ("store/.locks", True),  # lock files: a member's cannot be deleted or swapped by another
    ("store/.bytecode", True),  # each member's bytecode index files (store/bytecode.py)
    ("store/.roots", True),
    ("store/.roots/projects", True),
    ("store/.roots/pins", True),
    ("store/.roots/runs", True),
    ("store/.roots/temp", True),  # live processes' roots: only their makers may remove them
    ("store/.roots/procs", True),  # roots held for a live process (a deploy's broker)
    ("cache", True),
    ("cache/downloads", False),
    ("cache/up-to-date", True),  # each member's no-op stamps (lock/stamp.py, realize/install.py)
    ("runs", True),
    ("state", True),  # each member's services' state folders, and the port registry
    ("state/ports", True),  # one file of reserved ports per member (runtime/portregistry.py)
)


def is_shared(home: Path) -> bool:
    """Whether ``home`` is a group-shared home (its store folder is setgid)."""
    try:
        return bool(os.stat(home / "store").st_mode & stat.S_ISGID)
    except OSError:
        return False


def apply_group_umask(home: Path) -> None:
    """In a shared home, let the group keep what the process creates: clear the umask's
    group bits (``027`` becomes ``007``). Elsewhere the umask is left alone."""
    if is_shared(home):
        current = os.umask(0)
        os.umask(current & ~0o070)


@contextmanager
def group_umask(home: Path) -> Iterator[None]:
    """:func:`apply_group_umask` for the block, the umask before restored after it: for a
    process that is not the CLI (a cluster shard's task on its node) and that writes
    something of its own after the block (submitit's result file, which no other member may
    change)."""
    current = os.umask(0o077)  # read without passing through a laxer umask
    os.umask(current)
    try:
        apply_group_umask(home)
        yield
    finally:
        os.umask(current)


def own_cache_folders(home: Path, name: str) -> list[Path]:
    """This user's own folders ``cache/<name>-<uid>`` and ``cache/<name>-<uid>-*`` (made when
    another member held the first name) that exist: folders of this user, never a link,
    whoever made the name."""
    return own_folders_in(home / "cache", name)


def own_cache_folder(home: Path, name: str) -> Path:
    """This user's own folder of ``name`` in the home's ``cache/`` (:func:`own_folder_in`)."""
    return own_folder_in(home / "cache", name)


def own_folders_in(parent: Path, name: str) -> list[Path]:
    """This user's own folders ``<parent>/<name>-<uid>`` and ``<name>-<uid>-*`` (made when
    another member held the first name) that exist: folders of this user, never a link,
    whoever made the name."""
    first = parent / f"{name}-{os.geteuid()}"
    names = [first, *sorted(parent.glob(f"{first.name}-*"))] if parent.is_dir() else []
    return [folder for folder in names if is_own_folder(folder)]


def own_folder_in(parent: Path, name: str) -> Path:
    """This user's own folder of ``name`` in ``parent`` (a folder every member writes in): one
    it already has (:func:`own_folders_in`), else ``<name>-<uid>`` made now (``0700``), else
    (another member made that name first: a folder open to all, a link) a fresh one no other
    member can have named first. Raises :class:`HarnessError` when none can be made."""
    import contextlib
    import tempfile

    existing = own_folders_in(parent, name)
    if existing:
        return existing[0]
    own = parent / f"{name}-{os.geteuid()}"
    try:
        own.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # a folder, a link, a file: is_own_folder tells
            own.mkdir(mode=0o700)
        if is_own_folder(own):
            return own
        return Path(tempfile.mkdtemp(prefix=f"{own.name}-", dir=own.parent))  # 0700, a name of its own
    except OSError as exc:
        raise HarnessError(f"{own}: cannot make this user's {name} folder: {exc.strerror or exc}") from None


def is_own_folder(folder: Path) -> bool:
    """Whether ``folder`` is a folder (not a link) of this user's."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def uv_cache(cache_dir: Path) -> Path:
    """Where uv keeps its cache for a home whose cache folder is ``cache_dir``: that folder,
    or, in a shared home, this member's own ``cache/uv-<uid>`` (:func:`own_cache_folder`).
    uv's cache holds the unpacked wheels an environment's files are hard links of, and the
    index pages a lock resolves from, all writable by the group in a shared home: another
    member could change a file there and have it installed into this member's next
    environment, or point a cached page at a wheel of theirs. Store paths, which are checked,
    are still shared; uv's cache is each member's own."""
    if cache_dir.name == "cache" and is_shared(cache_dir.parent):
        return own_cache_folder(cache_dir.parent, "uv")
    return cache_dir


def init_shared(home: Path, group: str) -> list[Path]:
    """Make ``home`` (new, or one the caller owns) a home every member of ``group`` shares.

    Creates the folders of :data:`LAYOUT`, gives them (and whatever the caller already owns
    in the home) to ``group``, and sets their modes: ``2775``, or ``3775`` for the sticky
    ones. Registered store paths keep their read-only modes. Returns the folders set up.
    Raises InputError for an unknown group or one the caller is not a member of, and
    HarnessError for a home folder the caller cannot change.
    """
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise InputError(
            f"store init --group {group}: no such group on this machine",
            hint="create it (`groupadd`) and add the lab's members to it",
        ) from None
    if os.geteuid() != 0 and gid not in os.getgroups() and gid != os.getegid():
        raise InputError(
            f"store init --group {group}: you are not a member of {group}",
            hint=f"ask an administrator to add you (`usermod -aG {group} $USER`), then log in again",
        )
    folders: list[Path] = []
    try:
        for relative, sticky in LAYOUT:
            folder = home / relative if relative else home
            if relative:
                _clear_the_way(folder, foreign=relative in _REMADE)
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, -1, gid)
            os.chmod(folder, 0o2775 | (stat.S_ISVTX if sticky else 0))
            folders.append(folder)
        _own_gc_lock(home / "store" / ".roots" / "gc.lock", gid)
        _give_existing(home, gid)
    except PermissionError as exc:
        raise HarnessError(
            f"store init: cannot set up {exc.filename}: permission denied",
            hint="run it as the owner of the home folder (or root)",
        ) from None
    return folders


#: Layout folders whose maker could remove every member's entries (roots of live processes):
#: ``init`` makes them anew when another user made them.
_REMADE = ("store/.roots/temp", "store/.roots/procs")


def _clear_the_way(folder: Path, *, foreign: bool) -> None:
    """Move aside what is in the place of a layout folder (or file) and must not be taken for
    it: a link or a file (``chown``/``chmod`` would follow a link to whatever it names), and,
    with ``foreign``, a folder another user made. It goes to ``.<name>.moved-<token>`` beside it."""
    import secrets

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and not (foreign and st.st_uid != os.geteuid()):
        return
    os.rename(folder, folder.with_name(f".{folder.name}.moved-{secrets.token_hex(4)}"))


def _own_gc_lock(path: Path, gid: int) -> None:
    """The store's gc lock file, made by the caller (the home's owner): every member locks
    it (``flock`` on a read-only descriptor), and none may delete it, which would let a
    realize root its paths on a new file while a gc holds the old one. Another user's file
    (or a link) there goes aside first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            _clear_the_way(path, foreign=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.fchown(fd, -1, gid)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


#: Folders of a home whose entries are each member's own (run records, services' state): what
#: a member had there before the home was shared is handed to the group to read, not to write.
_OWN_TREES = ("runs", "state")


def _give_existing(home: Path, gid: int) -> None:
    """Hand what the caller already has in the home to the group: folders become setgid and
    group-writable, other files group-readable (group-writable when owner-writable), except
    inside :data:`_OWN_TREES`, where both become group-readable only. What only its owner
    could reach (a broker's token, a member's own ``cache/<name>-<uid>`` folder) stays so,
    and store paths keep their read-only modes; another user's files are left as they are."""
    store = home / "store"
    me = os.geteuid()
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or (me != 0 and st.st_uid != me):
                continue
            os.chown(path, -1, gid)
            mode = stat.S_IMODE(st.st_mode)
            if _inside_object(path, store) or not mode & 0o077:
                continue  # a store path (or inside one) stays read-only; an owner-only entry, its owner's
            relative = path.relative_to(home).parts
            writable = relative[0] not in _OWN_TREES or len(relative) == 1
            if stat.S_ISDIR(st.st_mode):
                os.chmod(path, mode | (0o2070 if writable else 0o2050))
            else:
                os.chmod(path, mode | 0o040 | (0o020 if mode & 0o200 and writable else 0))


def _inside_object(path: Path, store: Path) -> bool:
    try:
        parts = path.relative_to(store).parts
    except ValueError:
        return False
    return bool(parts) and not parts[0].startswith(".")
