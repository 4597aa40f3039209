"""``harness store verify``: is every registered path still what it was when registered?"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.store.store import Record, Store


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "ok", "modified", "missing"; or, not counted against the store: "ignored"
    detail: str = ""


#: Statuses that are not a fault of a path this user uses: a planted entry, another member's
#: path this user does not trust. Reported, never failing the command (``harness/store/entries.py``).
NOT_FAULTS = frozenset({"ok", "ignored"})


def verify_store(store: Store, *, check_contents: bool, names: list[str] | None = None) -> list[Finding]:
    """One finding per registered path (or per name asked for), sorted by name.

    Without ``check_contents`` each path is checked as the launch check does
    (:func:`harness.store.launchcheck.check_path`): its stat fingerprint, and a re-hash only
    where a figure moved (or there is none), so a changed file is found without reading
    every byte. With it, every byte is re-hashed and compared with the record's content hash.
    A modified path names the entries whose stat changed since it was registered.
    """
    findings: list[Finding] = []
    records: list[Record] = []
    if names:
        for name in names:
            record = _record_or_missing(store, name, findings)
            if record is not None:
                records.append(record)
    else:
        # Records whose path is gone too: a path deleted behind the store's back is "missing".
        records = list(store.records(even_if_gone=True))
        findings += [Finding(_entry_name(message), "ignored", message) for message in store.bad_entries]
        findings += [
            Finding(r.name, "ignored", f"registered by {_who(store, r.name)}, whom you do not trust here")
            for r in store.records(any_member=True)
            if store.untrusted_owner(r.name) is not None
        ]
    for record in records:
        findings.append(_check(store, record, check_contents=check_contents))
    return sorted(findings, key=lambda f: f.name)


def _check(store: Store, record: Record, *, check_contents: bool) -> Finding:
    from harness.store.hashing import nar_digest
    from harness.store.launchcheck import IntegrityError, check_path
    from harness.store.statfile import changed_entries

    if not os.path.lexists(store.root / record.name):
        return Finding(record.name, "missing", "registered but gone")
    lost = [ref for ref in record.references if not store.is_registered(ref)]
    if lost:
        return Finding(record.name, "missing", f"references {', '.join(lost)} are gone")
    if not check_contents:
        try:
            check_path(store.root, record.name, record.content)
        except IntegrityError as exc:
            return Finding(record.name, "modified", _changed(_other_bytes(store, exc.files), exc.expected, exc.found))
        return Finding(record.name, "ok")
    changed = changed_entries(store.root, record.name, record.content)
    try:
        digest = nar_digest(store.root / record.name)
    except HarnessError as exc:
        return Finding(record.name, "modified", exc.message)
    if digest.hash != record.content:
        return Finding(
            record.name, "modified", _changed(_other_bytes(store, changed or []), record.content, digest.hash)
        )
    return Finding(record.name, "ok")


def _other_bytes(store: Store, files: list[str]) -> list[str]:
    """Of ``files`` (entries, from the store's root, whose stat moved since registration), those
    whose bytes may not be what was registered; all of them when that leaves none.

    A file that is one inode with the pool entry named by the blake3 of its bytes now
    (``.links/<hex>[x]``, ``Store._share_files``) holds bytes the store pooled under that
    very name, so it is left out: another path linking or unlinking the same pool file (a
    realize whose environment shares it, a gc that collects one) moves its ctime, and the
    figures of an environment whose sibling came or went would otherwise bury the one file
    that changed. Only read when a path is found modified."""
    from harness.store.hashing import file_blake3

    suspects: list[str] = []
    for rel in files:
        path = store.root / rel
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                digest = file_blake3(path)
                if any(_same_inode(store.links_dir / f"{digest}{suffix}", st) for suffix in ("", "x")):
                    continue
        except OSError:
            pass
        suspects.append(rel)
    return suspects or files


def _same_inode(path: Path, st: os.stat_result) -> bool:
    try:
        other = os.lstat(path)
    except OSError:
        return False
    return (other.st_ino, other.st_dev) == (st.st_ino, st.st_dev)


def _changed(files: list[str], expected: str, found: str) -> str:
    shown = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")
    return (f"changed since registered: {shown}; " if files else "") + f"expected {expected}, found {found}"


def _entry_name(message: str) -> str:
    """The store name a bad-entry message is about (its ``.meta`` file), for sorting."""
    head = message.split(":", 1)[0]
    return os.path.basename(head).removesuffix(".json") or head


def _who(store: Store, name: str) -> str:
    from harness.store.store import user_name

    uid = store.untrusted_owner(name)
    return user_name(uid) if uid is not None else "someone"


def report(findings: list[Finding], repaired: list[str], *, as_json: bool) -> tuple[str, int]:
    """What ``harness store verify`` prints for ``findings`` (and the paths ``--repair``
    repaired), and its exit status: 1 when a path is modified or missing and was not repaired.
    """
    bad = [f for f in findings if f.status not in NOT_FAULTS]
    if as_json:
        import json

        data = {"findings": [f.__dict__ for f in findings], "repaired": repaired}
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)  # as cli.output.print_json
    else:
        lines = [
            f"{f.status:<9} {f.name}{f': {f.detail}' if f.detail else ''}"
            for f in findings
            if f.status != "ok" or not bad
        ]
        if not findings:
            lines.append("the store is empty")
        lines += [f"repaired  {name}" for name in repaired]
        text = "\n".join(lines)
    return text, 1 if bad and set(repaired) != {f.name for f in bad} else 0


def _record_or_missing(store: Store, name: str, findings: list[Finding]) -> Record | None:
    record = store.record(name, even_if_gone=True)
    if record is None:
        if store.untrusted_owner(name) is not None:
            findings.append(Finding(name, "ignored", f"registered by {_who(store, name)}, whom you do not trust here"))
        else:
            findings.append(Finding(name, "missing", "not registered"))
    return record
