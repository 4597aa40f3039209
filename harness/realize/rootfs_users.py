"""A rootfs template's users in its ``/etc/passwd`` and ``/etc/group``, reproducibly.

A template names the task users its root knows (``users = ["agent"]``); realize writes them
into the tree's ``etc/passwd`` and ``etc/group`` (:func:`write_users`, the one hook in
:mod:`harness.realize.rootfs`), so ``id agent`` and ``getent passwd agent`` answer inside a
session on that root even where the sandbox cannot give task users ids of their own. A
session adds the task's own users (``[agent] user``) the same way to its copy
(:mod:`harness.harbor.rootfs`).

Ids are Debian's: the first free uid from 1000 upwards, in the order the users are named, the
group of the same name and number. Lines already in the files (a package's) are kept as they
are; a tree without them gets ``root`` and ``nobody``/``nogroup``. The same names always give
the same bytes: two homes realize the same content.

:func:`add_users` is pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FIRST_UID = 1000
_BASE_PASSWD = ("root:x:0:0:root:/root:/bin/bash", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
_BASE_GROUP = ("root:x:0:", "nogroup:x:65534:")


def add_users(passwd: str | None, group: str | None, names: Iterable[str]) -> tuple[str, str, dict[str, int]]:
    """``passwd`` and ``group`` (None: no such file yet) with each of ``names`` they lack added;
    and the uid of each of ``names`` (pure)."""
    users = [line for line in (passwd.splitlines() if passwd is not None else _BASE_PASSWD) if line.strip()]
    groups = [line for line in (group.splitlines() if group is not None else _BASE_GROUP) if line.strip()]
    uids = {f[0]: int(f[2]) for f in (line.split(":") for line in users) if len(f) > 3 and f[2].isdigit()}
    gids = {f[0]: int(f[2]) for f in (line.split(":") for line in groups) if len(f) > 2 and f[2].isdigit()}
    out: dict[str, int] = {}
    for name in names:
        if name in uids:
            out[name] = uids[name]
            continue
        uid = FIRST_UID
        while uid in uids.values() or (uid in gids.values() and gids.get(name) != uid):
            uid += 1
        gid = gids.get(name, uid)
        before_nobody = next((i for i, line in enumerate(users) if line.startswith("nobody:")), len(users))
        users.insert(before_nobody, f"{name}:x:{uid}:{gid}:{name}:/home/{name}:/bin/bash")
        if name not in gids:
            before_nogroup = next((i for i, line in enumerate(groups) if line.startswith("nogroup:")), len(groups))
            groups.insert(before_nogroup, f"{name}:x:{gid}:")
            gids[name] = gid
        uids[name] = out[name] = uid
    return "\n".join(users) + "\n", "\n".join(groups) + "\n", out


def write_users(tree: Path, names: Iterable[str]) -> None:
    """Write ``names`` into ``tree``'s ``etc/passwd`` and ``etc/group`` (a build folder of the
    store: nothing there is a link out of it); nothing when there are none."""
    wanted = list(names)
    if not wanted:
        return
    etc = tree / "etc"
    if etc.is_symlink():
        raise OSError(f"{etc}: a link, not a folder")
    etc.mkdir(exist_ok=True)
    os.chmod(etc, 0o755)
    texts = []
    for name in ("passwd", "group"):
        path = etc / name
        texts.append(path.read_text(encoding="utf-8") if path.is_file() and not path.is_symlink() else None)
    passwd, group, _ids = add_users(texts[0], texts[1], wanted)
    for name, text in (("passwd", passwd), ("group", group)):
        path = etc / name
        if os.path.lexists(path):
            path.unlink()
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o644)
