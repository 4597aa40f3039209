"""``harness store verify``: is every registered path still what it was when registered?"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.store.store import Record, Store


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "ok", "modified", "missing"
    detail: str = ""


def verify_store(store: Store, *, check_contents: bool, names: list[str] | None = None) -> list[Finding]:
    """One finding per registered path (or per name asked for), sorted by name.

    Without ``check_contents`` only existence and references are checked (fast); with it,
    every byte is re-hashed and compared with the record's content hash.
    """
    from harness.store.hashing import nar_digest

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
    for record in records:
        if not os.path.lexists(store.root / record.name):
            findings.append(Finding(record.name, "missing", "registered but gone"))
            continue
        lost = [ref for ref in record.references if not store.is_registered(ref)]
        if lost:
            findings.append(Finding(record.name, "missing", f"references {', '.join(lost)} are gone"))
            continue
        if check_contents:
            try:
                digest = nar_digest(store.root / record.name)
            except HarnessError as exc:
                findings.append(Finding(record.name, "modified", exc.message))
                continue
            if digest.hash != record.content:
                findings.append(Finding(record.name, "modified", f"expected {record.content}, found {digest.hash}"))
                continue
        findings.append(Finding(record.name, "ok"))
    return sorted(findings, key=lambda f: f.name)


def report(findings: list[Finding], repaired: list[str], *, as_json: bool) -> tuple[str, int]:
    """What ``harness store verify`` prints for ``findings`` (and the paths ``--repair``
    repaired), and its exit status: 1 when a path is modified or missing and was not repaired.
    """
    bad = [f for f in findings if f.status != "ok"]
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
        findings.append(Finding(name, "missing", "not registered"))
    return record
