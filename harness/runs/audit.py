"""``harness audit RUN`` and ``harness diff RUN RUN``: proving afterwards what a run used.

Audit re-hashes every store path the run's ``lock.json`` names (the NAR content hash, the
same one registration recorded) and each project file it recorded, and reports each as ok,
modified or missing, plus the impurities the run named. A modified path names the files
inside it that changed where it can: store files are canonical (mtime 1, mode 0444/0555),
so a file whose metadata is not canonical was touched after registration.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.runs.record import read_json
from harness.store.store import FIXED_MTIME


@dataclass(frozen=True)
class AuditItem:
    path: str
    status: str  # ok | modified | missing
    detail: str = ""


@dataclass(frozen=True)
class AuditReport:
    run: str
    items: tuple[AuditItem, ...]
    impurities: tuple[str, ...]

    @property
    def failed(self) -> bool:
        return any(item.status != "ok" for item in self.items)

    def as_json(self) -> dict[str, Any]:
        return {"run": self.run, "ok": not self.failed,
                "items": [i.__dict__ for i in self.items], "impurities": list(self.impurities)}


def audit_run(run_dir: Path, store_root: Path, project_root: Path | None) -> AuditReport:
    """Re-check every path and project file of a recorded run."""
    from harness.store.hashing import file_sha256, nar_digest

    closure = read_json(run_dir / "lock.json")
    config = read_json(run_dir / "config.json")
    items: list[AuditItem] = []
    for entry in closure.get("store_paths", []):
        path = store_root / entry["path"]
        if not os.path.lexists(path):
            items.append(AuditItem(entry["path"], "missing", "not in the store"))
            continue
        try:
            digest = nar_digest(path)
        except Exception as exc:  # unreadable or odd files count as modified, with the reason
            items.append(AuditItem(entry["path"], "modified", str(exc)))
            continue
        if digest.hash != entry["content"]:
            touched = touched_files(path)
            where = f"changed: {', '.join(touched)}" if touched else "content changed"
            items.append(AuditItem(entry["path"], "modified",
                                   f"{where} (expected {entry['content']}, found {digest.hash})"))
        else:
            items.append(AuditItem(entry["path"], "ok"))
    root = Path(config.get("project", {}).get("root") or project_root or ".")
    for rel, expected in sorted(closure.get("project_files", {}).items()):
        file = root / rel
        if not file.is_file():
            items.append(AuditItem(rel, "missing", f"project file not found under {root}"))
        elif "sha256:" + file_sha256(file) != expected:
            items.append(AuditItem(rel, "modified", f"project file changed since the run ({expected})"))
        else:
            items.append(AuditItem(rel, "ok"))
    if config.get("cluster"):  # a cluster run: every shard's closure against the lock
        from harness.runs.cluster import audit_shards

        items += audit_shards(run_dir, closure)
    impurities = list(config.get("impurities", []))
    result_file = run_dir / "result.json"
    if result_file.is_file():
        impurities += [i for i in read_json(result_file).get("impurities", []) if i not in impurities]
    return AuditReport(run_dir.name, tuple(items), tuple(impurities))


def touched_files(path: Path, limit: int = 20) -> list[str]:
    """Files under ``path`` whose metadata is no longer canonical (edited since registration)."""
    found: list[str] = []
    entries = [path] if not path.is_dir() or path.is_symlink() else []
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in sorted(filenames) + sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))):
                entries.append(Path(dirpath, name))
    for entry in entries:
        st = os.lstat(entry)
        if stat.S_ISLNK(st.st_mode):
            canonical = st.st_mtime == FIXED_MTIME
        else:
            canonical = st.st_mtime == FIXED_MTIME and stat.S_IMODE(st.st_mode) in (0o444, 0o555)
        if not canonical:
            found.append(str(entry.relative_to(path.parent)))
            if len(found) >= limit:
                break
    return found


def diff_runs(a: Path, b: Path) -> list[str]:
    """What differs between two runs, one line per difference, in a stable order."""
    lines: list[str] = []
    closure_a, closure_b = read_json(a / "lock.json"), read_json(b / "lock.json")
    config_a, config_b = read_json(a / "config.json"), read_json(b / "config.json")
    locks_a, locks_b = closure_a.get("locks", {}), closure_b.get("locks", {})
    for name in sorted(set(locks_a) | set(locks_b)):
        if name not in locks_b:
            lines.append(f"service {name}: removed")
            continue
        if name not in locks_a:
            lines.append(f"service {name}: added")
            continue
        la, lb = locks_a[name], locks_b[name]
        if la.get("python") != lb.get("python"):
            lines.append(f"{name}: python {la.get('python')} → {lb.get('python')}")
        if la.get("code") != lb.get("code"):
            lines.append(f"{name}: code {la.get('code') or '(none)'} → {lb.get('code') or '(none)'}")
        lines += _mapping_diff(f"{name}: package", la.get("packages", {}), lb.get("packages", {}))
        sa, sb = la.get("sources", {}), lb.get("sources", {})
        for source in sorted(set(sa) | set(sb)):
            ca = (sa.get(source) or {}).get("commit")
            cb = (sb.get(source) or {}).get("commit")
            if ca != cb:
                lines.append(f"{name}: source {source}: {ca or '(none)'} → {cb or '(none)'}")
        wa, wb = la.get("weights", {}), lb.get("weights", {})
        for weights in sorted(set(wa) | set(wb)):
            lines += _mapping_diff(f"{name}: weights {weights}", wa.get(weights, {}), wb.get(weights, {}))
    lines += _mapping_diff("project file", closure_a.get("project_files", {}), closure_b.get("project_files", {}))
    pa = {s["name"]: s for s in config_a.get("plan", {}).get("services", [])}
    pb = {s["name"]: s for s in config_b.get("plan", {}).get("services", [])}
    for service in sorted(set(pa) | set(pb)):
        for key in ("mode", "gpu", "swap", "port", "url"):
            va, vb = (pa.get(service) or {}).get(key), (pb.get(service) or {}).get(key)
            if va != vb:
                lines.append(f"placement {service}.{key}: {va} → {vb}")
    for key in ("command", "agent", "overrides", "deploy", "benchmark"):
        if config_a.get(key) != config_b.get(key):
            lines.append(f"configuration {key}: {_short(config_a.get(key))} → {_short(config_b.get(key))}")
    return lines


def _mapping_diff(label: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            lines.append(f"{label} {key}: {a.get(key, '(none)')} → {b.get(key, '(none)')}")
    return lines


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."
