"""Which uids and gids a session's user namespace can hold: the plan for task users.

A user namespace maps ids inside to ids on the host. The sandbox's root (uid 0 inside) is
always the invoking user; a task's other users (Harbor's ``[agent] user``, ``[verifier]
user``) need ids of their own *on the host* too, or the kernel would see one owner and a
"read-only" ``/logs/verifier`` would be one ``chmod`` away from the agent. Three ways:

* ``root``: Harbor runs as the host's root, which may write any map: inside 1..65536 map
  to host ids from root's ``/etc/subuid`` range, else from :data:`ROOT_BASE` (above the
  ranges systemd-nspawn and Debian's ``useradd`` hand out).
* ``subid``: an unprivileged user with a subordinate id range (``/etc/subuid`` and
  ``/etc/subgid``, as Podman uses) and the setuid helpers ``newuidmap``/``newgidmap``
  (Debian package ``uidmap``): inside 1..N map to that range.
* ``single``: neither: the namespace holds one id, the sandbox's root, and every command
  runs as it (task users are then recorded as not enforced, with what to do).

Pure except :func:`probe` (reads ``/etc/subuid``, ``/etc/subgid``, looks for the helpers).
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Host id of inside uid/gid 1 when the host's root has no /etc/subuid range of its own.
ROOT_BASE = 0x70000000
#: How many ids inside (1..COUNT) a mapped namespace holds at most.
COUNT = 65536
#: First inside uid handed to a named task user (Docker images' first user is usually 1000).
FIRST_USER = 1000


@dataclass(frozen=True)
class IdMap:
    """How the session's ids map to the host's; see the module doc."""

    mode: str  # "root", "subid" or "single"
    uid: int  # host uid of the sandbox's root
    gid: int
    uid_base: int = 0  # host uid of inside uid 1 (not for "single")
    gid_base: int = 0
    count: int = 0  # inside ids 1..count are mapped
    reason: str = ""  # for "single": why there are no more ids, and what to do

    @property
    def multi(self) -> bool:
        return self.mode != "single" and self.count > 0

    def uid_lines(self) -> str:
        return f"0 {self.uid} 1\n1 {self.uid_base} {self.count}\n"

    def gid_lines(self) -> str:
        return f"0 {self.gid} 1\n1 {self.gid_base} {self.count}\n"

    def host_uid(self, inner: int) -> int:
        return self.uid if inner == 0 else self.uid_base + inner - 1

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "root_is_host_uid": self.uid}
        if self.multi:
            out.update(host_uid_base=self.uid_base, host_gid_base=self.gid_base, count=self.count)
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class TaskUser:
    """A user the task names, and its ids inside the sandbox."""

    name: str
    uid: int
    gid: int
    home: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "home": self.home}


@dataclass
class UserTable:
    """The sandbox's users: root, and each task user with its inside ids (pure)."""

    users: dict[str, TaskUser] = field(default_factory=dict)

    @classmethod
    def plan(cls, names: list[str | int], idmap: IdMap, fixed: Mapping[str, int] | None = None) -> UserTable:
        """Inside ids for ``names`` (Harbor's ``user`` values: a name or a uid). A name gets
        its uid in ``fixed`` (a rootfs template's ``/etc/passwd``) where the namespace holds
        it, else :data:`FIRST_USER` upwards in the order given; a number is taken as the uid.
        Raises ``ValueError`` for a uid the namespace cannot hold."""
        table = cls()
        table.users["root"] = TaskUser("root", 0, 0, "/root")
        if not idmap.multi:
            return table
        reserved = set((fixed or {}).values())  # the root's other users keep their ids to themselves
        for name, uid in (fixed or {}).items():
            if name in names and 0 < uid < idmap.count and name not in table.users:
                table.users[name] = TaskUser(name, uid, uid, f"/home/{name}")
        next_uid = FIRST_USER if idmap.count >= FIRST_USER + len(names) else 1
        for raw in names:
            if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()):
                uid = int(raw)
                if uid == 0 or str(uid) in table.users:
                    continue
                if uid > idmap.count:
                    raise ValueError(f"uid {uid} is outside the sandbox's {idmap.count} mapped ids")
                table.users[str(uid)] = TaskUser(str(uid), uid, uid, f"/home/{uid}")
                continue
            if raw in table.users:
                continue
            while any(u.uid == next_uid for u in table.users.values()) or next_uid in reserved:
                next_uid += 1
            table.users[raw] = TaskUser(raw, next_uid, next_uid, f"/home/{raw}")
            next_uid += 1
        return table

    def get(self, user: str | int | None) -> TaskUser | None:
        """The task user for Harbor's ``user`` argument; None means the sandbox's root."""
        if user is None or user in ("root", 0, "0"):
            return None
        return self.users.get(str(user))

    def passwd(self, base: str = "") -> str:
        """``/etc/passwd`` of the session: root, the lines of ``base`` (a rootfs template's
        file) for users not in the table, the task users, nobody."""
        lines = ["root:x:0:0:root:/root:/bin/bash", *self._others(base, "nobody")]
        lines += [
            f"{u.name}:x:{u.uid}:{u.gid}:{u.name}:{u.home}:/bin/bash"
            for u in self.users.values()
            if u.uid != 0 and not u.name.isdigit()
        ]
        lines.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
        return "\n".join(lines) + "\n"

    def _others(self, base: str, last: str) -> list[str]:
        """The lines of ``base`` naming neither root, ``last`` nor a user of the table."""
        skip = {"root", last, *self.users}
        return [line for line in base.splitlines() if line.strip() and line.split(":", 1)[0] not in skip]

    def group(self, base: str = "") -> str:
        lines = ["root:x:0:", *self._others(base, "nogroup")]
        lines += [f"{u.name}:x:{u.gid}:" for u in self.users.values() if u.uid != 0 and not u.name.isdigit()]
        lines.append("nogroup:x:65534:")
        return "\n".join(lines) + "\n"


def _subid_range(path: Path, names: tuple[str, ...]) -> tuple[int, int] | None:
    """The first ``start:count`` range of ``path`` owned by one of ``names`` (a name or uid)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in names and parts[1].isdigit() and parts[2].isdigit():
            if int(parts[2]) > 0:
                return int(parts[1]), int(parts[2])
    return None


def probe(etc: Path = Path("/etc")) -> IdMap:
    """The id map a session of this process can have (see the module doc)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    owners = (name, str(uid))
    subuid, subgid = _subid_range(etc / "subuid", owners), _subid_range(etc / "subgid", owners)
    if uid == 0:
        ubase, ucount = subuid or (ROOT_BASE, COUNT)
        gbase, gcount = subgid or (ROOT_BASE, COUNT)
        return IdMap("root", 0, gid, ubase, gbase, min(ucount, gcount, COUNT))
    helpers = [shutil.which(h, path="/usr/bin:/bin:/usr/sbin:/sbin") for h in ("newuidmap", "newgidmap")]
    if subuid and subgid and all(helpers):
        return IdMap("subid", uid, gid, subuid[0], subgid[0], min(subuid[1], subgid[1], COUNT))
    missing = []
    if not (subuid and subgid):
        missing.append(
            f"a subordinate id range for {name} in /etc/subuid and /etc/subgid "
            f"(root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {name})"
        )
    if not all(helpers):
        missing.append("newuidmap and newgidmap (apt-get install uidmap)")
    return IdMap("single", uid, gid, reason="task users need " + " and ".join(missing))
