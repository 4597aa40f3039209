"""Comparing two closures of a run (``lock.json``), pure: data in, differences out.

A cluster run is proven by one comparison made three times: the node compares the closure
it realized with the head's before its shard's first episode (:mod:`harness.runs.shard`),
the head compares each shard's recorded closure with its own (:mod:`harness.runs.cluster`),
and ``harness audit`` / ``harness diff`` compare them again from the records
(:mod:`harness.runs.audit`). :func:`closure_differences` names each difference the way a
person looks for it: an interpreter or environment by its name without the hash ("the head
ran ``…-cpython-3.11.7``, this node ``…-cpython-3.11.7-host``"), a path whose bits differ by
its two content hashes, a lock file whose bytes differ by its two blake3 hashes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: A store path name: 32 hash characters, a dash, the readable name.
_HASHED = re.compile(r"^[0-9a-df-np-sv-z]{32}-(.+)$")

#: What of ``lock.json``'s ``locks.<name>`` a node needs to name a difference.
_LOCK_KEYS = ("interpreter", "standing_in_for", "environment", "lock", "lock_blake3", "python", "code")


@dataclass(frozen=True)
class Difference:
    """One difference between an expected closure and an actual one: ``what`` differs
    (a store path's readable name, ``<manifest>: interpreter``, ``lock of <manifest>``),
    ``expected`` and ``actual`` say how (``(none)`` where one side has nothing)."""

    what: str
    expected: str
    actual: str

    def told(self, expected: str = "on the head", actual: str = "here") -> str:
        """``what: X on the head, Y here`` (the two sides named by the caller)."""
        return f"{self.what}: {self.expected} {expected}, {self.actual} {actual}"


def closure_digest(lock_json: dict[str, Any]) -> str:
    """blake3 over the sorted (store path, content hash) pairs of a record's ``lock.json``:
    equal digests mean the same store paths with the same bits."""
    from blake3 import blake3

    pairs = sorted((e["path"], e["content"]) for e in lock_json.get("store_paths", []))
    return "blake3:" + blake3(json.dumps(pairs).encode()).hexdigest()


def expected_closure(lock_json: dict[str, Any]) -> dict[str, Any]:
    """What a node needs of the head's ``lock.json`` to check its own against it: every
    store path with its content hash, and per manifest its interpreter, environment and
    lock file hash (not the packages and weights: the paths say those). Plain JSON."""
    return {
        "store_paths": [
            {"path": str(e.get("path")), "content": str(e.get("content"))} for e in lock_json.get("store_paths", [])
        ],
        "locks": {
            str(name): {key: info.get(key) for key in _LOCK_KEYS}
            for name, info in sorted((lock_json.get("locks") or {}).items())
            if isinstance(info, dict)
        },
    }


def readable(path: str) -> str:
    """A store path name without its hash (``kinematics-env``), or the name itself."""
    match = _HASHED.match(path)
    return match.group(1) if match else path


def _interpreter(info: dict[str, Any]) -> str:
    path = str(info.get("interpreter") or "(not recorded)")
    own = info.get("standing_in_for")
    return f"{path} (a host copy standing in for {own})" if own else path


def closure_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[Difference]:
    """Every difference between two closures (``lock.json`` or :func:`expected_closure`),
    interpreters first, then the store paths, then the lock files; empty when they are
    the same store paths with the same content hashes, from the same lock files.

    A path of one side whose readable name the other side has under another hash (an
    environment built on another interpreter) is one difference naming both paths; an
    interpreter that an interpreter line names is not named again as a path."""
    found: list[Difference] = []
    named: set[str] = set()  # interpreters an interpreter line names already
    locks_e, locks_a = expected.get("locks") or {}, actual.get("locks") or {}
    for name in sorted(set(locks_e) | set(locks_a)):
        le, la = locks_e.get(name), locks_a.get(name)
        if le is None or la is None:
            found.append(Difference(f"manifest {name}", "used" if le else "(none)", "used" if la else "(none)"))
            continue
        if le.get("interpreter") != la.get("interpreter") or le.get("standing_in_for") != la.get("standing_in_for"):
            named.update(str(info.get("interpreter")) for info in (le, la))
            own = le.get("standing_in_for")
            if own and own == la.get("standing_in_for"):  # both host copies standing in for the lock's
                what = f"{name}: interpreter (a host copy standing in for {own})"
                found.append(Difference(what, str(le.get("interpreter")), str(la.get("interpreter"))))
            else:
                found.append(Difference(f"{name}: interpreter", _interpreter(le), _interpreter(la)))
    paths_e = {str(e["path"]): str(e["content"]) for e in expected.get("store_paths", [])}
    paths_a = {str(e["path"]): str(e["content"]) for e in actual.get("store_paths", [])}
    for path in sorted(set(paths_e) & set(paths_a)):
        # "" expected: a path of another target than the head's, known before it is built by
        # name only (harness/runs/groups.py)
        if paths_e[path] and paths_e[path] != paths_a[path]:
            found.append(Difference(path, paths_e[path], paths_a[path]))
    only_e = {readable(p): p for p in sorted(set(paths_e) - set(paths_a))}
    only_a = {readable(p): p for p in sorted(set(paths_a) - set(paths_e))}
    for short in sorted(set(only_e) | set(only_a)):
        if {p for p in (only_e.get(short), only_a.get(short)) if p} <= named:
            continue  # an interpreter line says it
        found.append(Difference(short, only_e.get(short, "(none)"), only_a.get(short, "(none)")))
    for name in sorted(set(locks_e) & set(locks_a)):
        be, ba = locks_e[name].get("lock_blake3"), locks_a[name].get("lock_blake3")
        if be != ba:
            found.append(Difference(f"lock of {name}", str(be), str(ba)))
    return found


@dataclass(frozen=True)
class NodeInterpreter:
    """What a node's store holds for a lock's own interpreter before it realizes anything:
    whether that interpreter is registered there (realize then uses it), and which host copy
    is noted as standing in for it (``store/.standins/``), if any."""

    own_registered: bool
    standin: str | None


def foreseen_differences(
    expected: dict[str, Any], interpreters: dict[str, NodeInterpreter], lock_hashes: dict[str, str]
) -> list[Difference]:
    """What a node can tell is not the head's closure before it realizes anything, pure:
    ``expected`` is the head's closure, ``interpreters`` what the node's store holds per lock
    interpreter (by its store name), ``lock_hashes`` the blake3 of the node's own lock files by
    manifest. Only certain differences: where a host copy stood in on the head, a node whose
    store has the lock's own interpreter, or notes another host copy, realizes on that one;
    a lock file with other bytes locks other paths. (A node with neither realizes a host copy
    of its own, which may well be the head's bits: only realizing tells.)"""
    found: list[Difference] = []
    for name, info in sorted((expected.get("locks") or {}).items()):
        own, host = info.get("standing_in_for"), info.get("interpreter")
        here = interpreters.get(str(own)) if own else None
        if here is not None and here.own_registered:
            found.append(
                Difference(
                    f"{name}: interpreter",
                    f"{host} (a host copy standing in for {own})",
                    f"{own} (the lock's own, registered here, which realize prefers)",
                )
            )
        elif here is not None and here.standin and here.standin != host:
            found.append(
                Difference(f"{name}: interpreter (a host copy standing in for {own})", str(host), here.standin)
            )
        theirs = lock_hashes.get(name)
        if theirs is not None and info.get("lock_blake3") and theirs != info.get("lock_blake3"):
            found.append(Difference(f"lock of {name}", str(info.get("lock_blake3")), theirs))
    return found


def mismatch_message(differences: list[Difference], *, shown: int = 10) -> str:
    """One line naming ``differences`` between the head's closure and this node's."""
    told = "; ".join(d.told("on the head", "here") for d in differences[:shown])
    more = f"; and {len(differences) - shown} more" if len(differences) > shown else ""
    return f"this node's closure is not the head's ({len(differences)} difference(s)): {told}{more}"
