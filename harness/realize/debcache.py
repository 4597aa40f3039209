"""The ``.deb`` files of rootfs templates, downloaded into ``$HARNESS_HOME/cache/debs/``.

In a home a lab shares (``harness store init --group``) the folder is the group's: one member's
download serves the others. It is not sticky, so another member can plant anything under the
name a download will take, or change a file a member downloaded (group-writable) after the
check. Nothing planted there is trusted or fails anyone's realize:

* before a download, what stands under its names (``<sha256>.lock``, then, holding that lock,
  ``<sha256>.deb`` and ``.deb.part``) and is not what harness would write there is removed: a symlink, a fifo, a folder; a partial
  file of another member's (this user might not be able to append to it). A regular ``.deb`` of
  another member's is checked like any download (kept when its size and sha256 are the lock's,
  replaced otherwise; a huge one is judged by its size without being read);
* where the shared folder cannot be used (another member made it a link, or closed it) or a
  planted name cannot be removed, the user's own ``cache/debs-<uid>/`` (0700) takes the
  download; where another member made that name first (``cache/`` is sticky in a shared
  home: this user cannot remove it), a fresh folder of this user's own,
  ``cache/debs-<uid>-<random>/`` (0700, made by ``mkdtemp``: no name another could take
  first), does, and later realizes find it again (:func:`own_folders`);
* a ``.deb`` is read once, whole, into memory when a template is built, and its bytes are
  checked against the lock's sha256 again (:func:`harness.download.read_checked`): a file another member
  changed after the download was checked is refused by name, never unpacked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from harness.errors import HarnessError

#: The folder of a home that holds the ``.deb`` downloads.
FOLDER = Path("cache") / "debs"


def shared_folder(home: Path) -> Path:
    return home / FOLDER


def own_folders(home: Path) -> list[Path]:
    """This user's own folders of downloads that exist: ``debs-<uid>`` and the fresh
    ``debs-<uid>-*`` made when another member held that name (:func:`own_cache_folders`)."""
    from harness.store.shared import own_cache_folders

    return own_cache_folders(home, "debs")


def downloaded(home: Path, sha256: str) -> bool:
    """Whether a ``.deb`` of ``sha256`` is downloaded in ``home`` (its bytes are checked when
    it is used)."""
    return any((folder / f"{sha256}.deb").is_file() for folder in (shared_folder(home), *own_folders(home)))


def fetch(home: Path, sha256: str, download: Callable[[Path], None]) -> Path:
    """``<sha256>.deb`` in this user's folder of downloads (module doc), put there by
    ``download(dest)`` under the file's lock; what another member planted under its names is
    cleared first (its partial file only under the lock: a member downloading it now holds it)."""
    from harness.store.store import lock_file

    shared = shared_folder(home)
    for candidate in [*([shared] if _writable(shared) else []), None]:  # None: this user's own
        folder = candidate if candidate is not None else _own(home)
        if not _clear(folder, (f"{sha256}.lock",)):
            continue
        with lock_file(folder / f"{sha256}.lock"):  # two sessions realizing templates that share a .deb
            if not _clear(folder, (f"{sha256}.deb", f"{sha256}.deb.part")):
                continue
            dest = folder / f"{sha256}.deb"
            download(dest)
            return dest
    own = _own(home)
    raise HarnessError(f"{own}: cannot clear the names of the download {sha256}.deb there")


def _writable(folder: Path) -> bool:
    """Whether the shared ``folder`` (made now if missing) is a folder, not a link, this user
    can write in."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return stat.S_ISDIR(os.lstat(folder).st_mode) and os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        return False


def _own(home: Path) -> Path:
    """This user's own folder of downloads (:func:`own_cache_folder`): ``debs-<uid>``, or a
    fresh one where another member made that name first."""
    from harness.store.shared import own_cache_folder

    return own_cache_folder(home, "debs")


def _clear(folder: Path, names: tuple[str, ...]) -> bool:
    """Remove what stands under ``names`` in ``folder`` and is not what harness writes there;
    False when something planted cannot be removed."""
    for name in names:
        path = folder / name
        try:
            st = os.lstat(path)
            if _usable(path, st, own=name.endswith(".part")):
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def _usable(path: Path, st: os.stat_result, *, own: bool) -> bool:
    """A regular file this user can read (and, where ``own``, one of this user's)."""
    if not stat.S_ISREG(st.st_mode):
        return False
    if own:
        return st.st_uid == os.geteuid()
    return os.access(path, os.R_OK)
