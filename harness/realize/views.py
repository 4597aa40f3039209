"""Source views: a checkout with links into the weights added, as a store path of its own.

Some projects find their assets next to their code: RoboDojo builds every asset path from
``os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Assets")``, and its setup
script makes ``<checkout>/Assets`` a link to a downloaded dataset. A checkout in the store is
read-only and its content is fixed by its commit, so a manifest's ``links`` (``{ Assets =
"{weights}/robodojo/Assets" }``) are not put into it. Realize makes a *view* instead:

* the checkout's folders as real folders and its files as **hard links** to the checkout's
  (no bytes copied; a copy only where the file system refuses a link, as for a file of another
  user under ``fs.protected_hardlinks``), its own symbolic links as they are;
* each link's path a relative symbolic link to the weight set's folder (``<view>/Assets`` →
  ``../<weights>/Assets``), replacing whatever the checkout holds there.

Why not a tree of symbolic links, as Nix's ``symlinkJoin``: the kernel resolves ``..`` after a
symbolic link in the link's target folder, so ``<view>/env/../Assets`` would be the checkout's
``Assets`` again; and CPython puts a script's *resolved* folder on ``sys.path``. Hard links give
the code the view's paths whatever it does with them.

A hard link changes the linked file's ctime (its link count), so the first launch check after a
view is made (or removed by gc) re-hashes the checkout once and refreshes its fingerprint
(:mod:`harness.store.launchcheck`): time, never a wrong answer.

The links are relative and computed from the view's final place, so the view means the same in
every store location and hashes the same in every home. ``{source:NAME}`` and a path source's
``.pth`` name the view (:func:`harness.lock.storepaths.source_folders`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from harness.store.store import BuildResult, Store

if TYPE_CHECKING:
    from harness.lock.document import Lock


def build_view(out: Path, final: Path, checkout: Path, store_root: Path, links: dict[str, str]) -> None:
    """Make the view of ``checkout`` with ``links`` ({path in the view: target relative to
    ``store_root``}) at ``out``, its links relative to where it will live (``final``)."""
    out.mkdir()
    for dirpath, dirnames, filenames in os.walk(checkout):
        here = Path(dirpath)
        there = out / here.relative_to(checkout)
        for name in list(dirnames):
            if (here / name).is_symlink():  # os.walk lists a link to a folder among the folders
                dirnames.remove(name)
                filenames.append(name)
            else:
                (there / name).mkdir()
        for name in filenames:
            _mirror(here / name, there / name)
    for path, target in sorted(links.items()):
        link = out / path
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(store_root / target, (final / path).parent))


def _mirror(source: Path, dest: Path) -> None:
    if source.is_symlink():
        dest.symlink_to(os.readlink(source))
        return
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def add_source_views(store: Store, lock: Lock) -> list[str]:
    """Build and register the views of ``lock``'s sources that have links (their checkouts
    and weight sets registered already); returns the view names it made."""
    from harness.lock.storepaths import link_target, source_view_path

    made = []
    for source in lock.sources:
        view = source_view_path(lock, source)
        if view is None or store.is_registered(view):
            continue
        targets = {path: link_target(lock, target) for path, target in source.links.items()}
        links = {path: f"{weights}/{inside}" if inside else weights for path, (weights, inside) in targets.items()}

        def build(
            out: Path, view: str = view, checkout: str = source.store, links: dict[str, str] = links
        ) -> BuildResult:
            build_view(out, store.root / view, store.root / checkout, store.root, links)
            return BuildResult(obtained="links")

        references = (source.store, *sorted({weights for weights, _ in targets.values()}))
        store.add(view, "source-view", build, references=references)
        made.append(view)
    return made
