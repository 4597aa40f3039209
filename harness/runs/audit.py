"""``harness audit RUN`` and ``harness diff RUN RUN``: proving afterwards what a run used.

Audit re-hashes every store path the run's ``lock.json`` names (the NAR content hash, the
same one registration recorded) and each project file it recorded, and reports each as ok,
modified or missing, plus the impurities the run named. A modified path names the files
inside it that changed where it can: store files are canonical (mtime 1, mode 0444/0555),
so a file whose metadata is not canonical was touched after registration.

A run is judged as it ran: every store path a service or the benchmark worker started from
was checked at launch (:mod:`harness.store.launchcheck`, kept in the run's
``services/launch-checks.jsonl``). For such a path the verdict is the launch's — ``ok`` when
it was verified, ``modified`` when the launch was refused — and today's store only adds a
note (``store_now``): a store tampered with or repaired after the run does not change what
the run computed with. A path gone from the store (collected by ``store gc``) is ``missing``
all the same: nothing can re-check or reproduce it. Paths no launch checked (wheels, a
service never started, records from before launch checks) are judged by re-hashing today's
store, as before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.runs.record import read_json
from harness.store.entries import is_regular
from harness.store.store import FIXED_MTIME


@dataclass(frozen=True)
class AuditItem:
    path: str
    status: str  # ok | modified | missing; a cluster shard also failed | cancelled
    detail: str = ""
    at_launch: str = ""  # "stat" / "hash" (verified when launched), "refused", "" (not launched)
    store_now: str = ""  # for a path judged at launch: how today's store differs, "" if it does not


@dataclass(frozen=True)
class AuditReport:
    run: str
    items: tuple[AuditItem, ...]
    impurities: tuple[str, ...]
    #: resets of scoped services during the run (see :mod:`harness.runs.resets`): not
    #: failures, but the one way a swap changed what the run computed
    scoped_resets: tuple[dict[str, Any], ...] = ()

    @property
    def failed(self) -> bool:
        return any(item.status != "ok" for item in self.items)

    def fails(self, *, strict: bool) -> bool:
        """Whether the audit fails: a path changed or gone (a shard refused, failed, …), or,
        with ``strict``, any impurity or reset of a scoped service."""
        return self.failed or (strict and bool(self.impurities or self.scoped_resets))

    def verdict(self, *, strict: bool) -> str:
        """The audit's last line after ``audit of run RUN:``, saying why it fails when it does."""
        counts = [f"{len(self.items)} checked", _count(len(self.impurities), "impurity", "impurities")]
        if self.scoped_resets:
            counts.append(_count(len(self.scoped_resets), "scoped reset", "scoped resets"))
        if self.failed:
            bad = sum(item.status != "ok" for item in self.items)
            return f"FAILED: {bad} of {len(self.items)} not as the run used them ({', '.join(counts[1:])})"
        if strict and (self.impurities or self.scoped_resets):
            what = ", ".join(counts[1:] if self.impurities else counts[2:])
            return f"impure: {what} (--strict fails on them); {len(self.items)} checked, each as the run used it"
        return f"ok ({', '.join(counts)})"

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "ok": not self.failed,
            "ok_strict": not self.fails(strict=True),
            "items": [i.__dict__ for i in self.items],
            "impurities": list(self.impurities),
            "scoped_resets": list(self.scoped_resets),
        }


def _count(number: int, one: str, many: str) -> str:
    return f"{number} {one if number == 1 else many}"


def audit_run(run_dir: Path, store_root: Path, project_root: Path | None) -> AuditReport:
    """Re-check every path and project file of a recorded run."""
    from harness.store.hashing import file_sha256

    closure = read_json(run_dir / "lock.json")
    config = read_json(run_dir / "config.json")
    launched = launch_verdicts(run_dir)
    items: list[AuditItem] = []
    pinned = is_regular(run_dir / "pinned")
    gone = "not in the store: collected by `harness store gc` or deleted" + (
        "" if pinned else f" (pin a run to keep what it used: `harness runs pin {run_dir.name}`)"
    )
    names = [entry["path"] for entry in closure.get("store_paths", [])]
    contents = {entry["path"]: entry["content"] for entry in closure.get("store_paths", [])}
    for name in names + sorted(set(launched) - set(names)):
        if not _store_path_name(name):
            items.append(AuditItem(str(name), "modified", "not a store path's name: the run record is damaged"))
            continue
        expected = contents.get(name) or launched[name][2]
        now = _store_now(store_root / name, expected)
        how, detail, _ = launched.get(name, ("", "", ""))
        store_now = (gone if now[0] == "missing" else now[1]) if now[0] != "ok" else ""
        if how == "refused":  # the run was refused this path: so it stays, repaired or not
            items.append(AuditItem(name, "modified", detail, at_launch=how, store_now=store_now))
        elif now[0] == "missing":  # verified at launch or not, a collected path can no longer be re-checked
            items.append(AuditItem(name, "missing", gone, at_launch=how))
        elif how:
            items.append(AuditItem(name, "ok", detail, at_launch=how, store_now=store_now))
        else:
            items.append(AuditItem(name, *now))
    root = Path(config.get("project", {}).get("root") or project_root or ".")
    for rel, expected in sorted(closure.get("project_files", {}).items()):
        file = root / rel
        if not _inside(rel):
            items.append(AuditItem(str(rel), "modified", "not a path inside the project: the run record is damaged"))
        elif not file.is_file():
            items.append(AuditItem(rel, "missing", f"project file not found under {root}"))
        elif "sha256:" + file_sha256(file) != expected:
            items.append(AuditItem(rel, "modified", f"project file changed since the run ({expected})"))
        else:
            items.append(AuditItem(rel, "ok"))
    items += audit_variants(closure, root)
    items += audit_targets(config, closure, root)
    if config.get("cluster"):  # a cluster run: every shard's closure against the lock
        items += audit_shards(run_dir, closure)
    impurities = list(config.get("impurities", []))
    result_file = run_dir / "result.json"
    if result_file.is_file():
        impurities += [i for i in read_json(result_file).get("impurities", []) if i not in impurities]
    for name, info in sorted(closure.get("locks", {}).items()):
        # A host copy stood in for the lock's interpreter: named even when the run's own list
        # of impurities (written by an older harness, or edited) does not say so.
        interpreter, own = info.get("interpreter"), info.get("standing_in_for")
        if own and not any(interpreter in line for line in impurities):
            impurities.append(f"{name}: host interpreter {interpreter} stood in for the lock's {own}")
    simulator = config.get("simulator")
    if isinstance(simulator, dict) and not any(f"simulator at {simulator.get('url')} " in i for i in impurities):
        # A simulator elsewhere is named even when the record's list of impurities does not.
        from harness.runs.simulator import simulator_impurity

        impurities.append(simulator_impurity(simulator))
    return AuditReport(run_dir.name, tuple(items), tuple(impurities), tuple(scoped_resets(run_dir)))


def scoped_resets(run_dir: Path) -> list[dict[str, Any]]:
    """The run's scoped resets: ``result.json``'s, else (a run still going, or killed) the log's."""
    from harness.runs.resets import RESETS_FILE, read_resets

    result_file = run_dir / "result.json"
    if result_file.is_file():
        recorded = read_json(result_file).get("scoped_resets")
        if isinstance(recorded, list):
            return [r for r in recorded if isinstance(r, dict)]
    return read_resets(run_dir / RESETS_FILE)


def describe_reset(reset: dict[str, Any]) -> str:
    """One line for a reset: which service, when, which lease saw it fresh."""
    import time

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(reset.get("at") or 0)))
    return (
        f"{reset.get('service')} reset at {when}: lease {reset.get('lease')} of client "
        f"{reset.get('client')} saw it fresh (incarnation {reset.get('previous_incarnation')} → "
        f"{reset.get('incarnation')})"
    )


def _store_path_name(name: object) -> bool:
    """Whether a record's ``name`` can only name an entry of the store (never ``..``, ``/``)."""
    from harness.store.hashing import check_store_name

    try:
        return isinstance(name, str) and bool(check_store_name(name))
    except ValueError:
        return False


def _inside(rel: object) -> bool:
    """Whether a record's project file ``rel`` is a relative path that stays in the project."""
    return isinstance(rel, str) and bool(rel) and not rel.startswith("/") and ".." not in Path(rel).parts


def launch_verdicts(run_dir: Path) -> dict[str, tuple[str, str, str]]:
    """Store path → (how it was checked at launch, detail, registered content hash), from
    the run's launch checks. A refusal outweighs any verification of the same path."""
    from harness.store.launchcheck import read_launches

    verdicts: dict[str, tuple[str, str, str]] = {}
    for entry in read_launches(run_dir / "services"):
        refused = entry.get("refused")
        if isinstance(refused, dict) and isinstance(refused.get("path"), str):
            files = ", ".join(str(f) for f in refused.get("files") or []) or "its content"
            detail = (
                f"refused at launch of {entry.get('launch')}: changed {files} "
                f"(expected {refused.get('expected')}, found {refused.get('found')})"
            )
            verdicts[refused["path"]] = ("refused", detail, str(refused.get("expected", "")))
        for name, check in (entry.get("paths") or {}).items():
            if verdicts.get(name, ("",))[0] != "refused" and isinstance(check, dict):
                how = str(check.get("verified", ""))
                verdicts[name] = (
                    how,
                    f"verified at launch of {entry.get('launch')} ({how})",
                    str(check.get("content", "")),
                )
    return verdicts


def _store_now(path: Path, expected: str) -> tuple[str, str]:
    """(status, detail) of today's copy of a store path against its registered hash."""
    from harness.store.hashing import nar_digest

    if not os.path.lexists(path):
        return "missing", "not in the store"
    try:
        digest = nar_digest(path)
    except (HarnessError, OSError) as exc:  # unreadable or odd files count as modified, with the reason
        return "modified", str(exc)
    if digest.hash != expected:
        touched = touched_files(path)
        where = f"changed: {', '.join(touched)}" if touched else "content changed"
        return "modified", f"{where} (expected {expected}, found {digest.hash})"
    return "ok", ""


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
    """What differs between two runs, one line per difference, in a stable order.

    Every input that shapes the computation is compared: per manifest the interpreter,
    packages, sources (commit, install mode), weights, code, environment store path and
    manifest digest; per service its launch (argv after templates, working directory, the
    variables harness sets); the run's own command as launched; project files; placement;
    the configuration (command, agent, overrides, deploy, benchmark); a simulator that runs
    elsewhere (its address, and each thing it reported itself to be); for cluster runs the
    engine, shard count, retries and each shard's status, score, platform, retries and
    closure against its head's (:func:`cluster_differences`). A difference that
    another one explains is not repeated: a bumped package changes the environment path and
    the interpreter path in the argv too, but the line names the package. Store paths in a
    launch compare by name without their hash (the hash's inputs are compared themselves),
    and the placement's port and URL by role, so a moved port is one placement line.
    """
    from harness.runs.simulator import simulator_differences

    lines: list[str] = []
    closure_a, closure_b = read_json(a / "lock.json"), read_json(b / "lock.json")
    config_a, config_b = read_json(a / "config.json"), read_json(b / "config.json")
    locks_a, locks_b = closure_a.get("locks", {}), closure_b.get("locks", {})
    explained: set[str] = set()  # services with a difference of their inputs already named
    for name in sorted(set(locks_a) | set(locks_b)):
        if name not in locks_b:
            lines.append(f"service {name}: removed")
            continue
        if name not in locks_a:
            lines.append(f"service {name}: added")
            continue
        before = len(lines)
        lines += _lock_diff(name, locks_a[name], locks_b[name])
        if len(lines) > before:
            explained.add(name)
    lines += _mapping_diff("project file", closure_a.get("project_files", {}), closure_b.get("project_files", {}))
    pa = {s["name"]: s for s in config_a.get("plan", {}).get("services", [])}
    pb = {s["name"]: s for s in config_b.get("plan", {}).get("services", [])}
    moved: dict[str, set[str]] = {}  # service -> placement keys that differ
    for service in sorted(set(pa) | set(pb)):
        for key in ("mode", "gpu", "swap", "port", "url"):
            va, vb = (pa.get(service) or {}).get(key), (pb.get(service) or {}).get(key)
            if va != vb:
                lines.append(f"placement {service}.{key}: {va} → {vb}")
                moved.setdefault(service, set()).add(key)
    launch_a, launch_b = config_a.get("launch"), config_b.get("launch")
    if isinstance(launch_a, dict) and isinstance(launch_b, dict):  # records before launch specs have none
        lines += _launch_diff(
            _with_project(launch_a, config_a),
            _with_project(launch_b, config_b),
            moved,
            asked_differs=config_a.get("command") != config_b.get("command"),
        )
    resets_a, resets_b = _reset_counts(a), _reset_counts(b)
    for service in sorted(set(resets_a) | set(resets_b)):
        if resets_a.get(service, 0) != resets_b.get(service, 0):
            lines.append(f"scoped resets of {service}: {resets_a.get(service, 0)} → {resets_b.get(service, 0)}")
    lines += cluster_differences(cluster_view(a, config_a, closure_a), cluster_view(b, config_b, closure_b))
    lines += simulator_differences(config_a.get("simulator"), config_b.get("simulator"))
    for key in ("command", "agent", "overrides", "deploy", "benchmark"):
        if config_a.get(key) != config_b.get(key):
            lines.append(f"configuration {key}: {_short(config_a.get(key))} → {_short(config_b.get(key))}")
    # The manifest digest covers keys no other line does (a health path, a client): named
    # only when nothing else about that service differs.
    services_named = {line.split(":", 1)[0].split(".", 1)[0].removeprefix("placement ") for line in lines}
    for name in sorted(set(locks_a) & set(locks_b)):
        da, db = locks_a[name].get("manifest_digest"), locks_b[name].get("manifest_digest")
        if da != db and name not in services_named:
            lines.append(f"{name}: manifest digest {da} → {db}")
    return lines


def cluster_view(run_dir: Path, config: dict[str, Any], head_closure: dict[str, Any]) -> dict[str, Any]:
    """What :func:`cluster_differences` compares of one run, read from its record: the
    engine, shard count and retries asked, and per shard its status, score, node platform,
    retries taken and how its closure differs from its head's (a local run: no engine, one
    shard, this record's own)."""
    from harness.runs.closures import closure_differences
    from harness.runs.groups import shard_expectation

    cluster = config.get("cluster") or {}
    if not cluster:
        return {"engine": None, "shards": 1, "retries": None, "per_shard": []}
    result_file = run_dir / "result.json"
    summaries = read_json(result_file).get("shards", []) if result_file.is_file() else []
    per_shard = []
    for summary in (s for s in summaries if isinstance(s, dict)):
        lock = run_dir / "shards" / str(summary.get("index")) / "lock.json"
        theirs = read_json(lock) if lock.is_file() else None
        expectation = shard_expectation(cluster, head_closure, theirs, summary.get("targets"))
        deviation = (
            expectation.problems
            + [d.told("on the head", "on the node") for d in closure_differences(expectation.expected, theirs)]
            if theirs is not None
            else ["no closure recorded"]
        )
        per_shard.append(
            {
                "index": summary.get("index"),
                "where": f"{summary.get('hostname') or '?'} ({summary.get('home') or '?'})",
                "status": summary.get("status"),
                "score": summary.get("score"),
                "platform": summary.get("platform"),
                "group": expectation.group if theirs is not None or summary.get("targets") else None,
                "retries": max(0, len(summary.get("attempts") or []) - 1),
                "closure": "; ".join(deviation) or "the head's",
            }
        )
    return {
        "engine": cluster.get("engine"),
        "shards": cluster.get("shards"),
        "retries": cluster.get("retries"),
        "per_shard": sorted(per_shard, key=lambda s: s["index"] if isinstance(s["index"], int) else -1),
    }


def cluster_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs in how two runs were spread over nodes (:func:`cluster_view`), pure.

    The engine, the shard count and the retries asked; then per shard (by index, when both
    runs have as many shards; else, where the values differ, what each run's shards were,
    counted) its status, score,
    node platform, retries taken and its closure against its head's. A shard whose node
    computed with another closure than its own head is named with its node and home and
    each difference, in whichever run it is."""
    from collections import Counter

    lines: list[str] = []
    if a["engine"] != b["engine"]:
        lines.append(f"cluster engine: {a['engine'] or '(a local run)'} → {b['engine'] or '(a local run)'}")
    if a["shards"] != b["shards"]:
        lines.append(f"cluster shards: {a['shards']} → {b['shards']}")
    if a["retries"] != b["retries"] and a["engine"] and b["engine"]:
        lines.append(f"cluster retries allowed: {a['retries']} → {b['retries']}")
    sa, sb = a["per_shard"], b["per_shard"]
    if sa and sb and [s["index"] for s in sa] == [s["index"] for s in sb]:
        for xa, xb in zip(sa, sb, strict=True):
            label = f"shard {xa['index']}/{a['shards']}"
            for key in ("status", "score", "platform", "group", "retries"):
                if xa.get(key) != xb.get(key):
                    lines.append(f"{label} {key}: {xa.get(key)} → {xb.get(key)}")
            if xa["closure"] != xb["closure"]:
                lines.append(
                    f"{label} closure: {xa['closure']} (on {xa['where']}) → {xb['closure']} (on {xb['where']})"
                )
        return lines

    def counted(shards: list[dict[str, Any]], key: str) -> str:
        counts = Counter(str(s.get(key)) for s in shards)
        return ", ".join(f"{value} ×{n}" for value, n in sorted(counts.items())) or "(none)"

    keys = (("status", "statuses"), ("score", "scores"), ("platform", "platforms"), ("group", "groups"))
    for key, label in (*keys, ("retries", "retries")):
        # Counted: with other shard counts, every count differs; only other values are news.
        if sa and sb and {str(s.get(key)) for s in sa} != {str(s.get(key)) for s in sb}:
            lines.append(f"shard {label}: {counted(sa, key)} → {counted(sb, key)}")
    for run, shards, count in (("A", sa, a["shards"]), ("B", sb, b["shards"])):
        for shard in shards:
            if shard["closure"] != "the head's":
                lines.append(
                    f"shard {shard['index']}/{count} of run {run} on {shard['where']}: "
                    f"not its head's closure: {shard['closure']}"
                )
    return lines


def _reset_counts(run_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reset in scoped_resets(run_dir):
        counts[str(reset.get("service"))] = counts.get(str(reset.get("service")), 0) + 1
    return counts


def _lock_diff(name: str, la: dict[str, Any], lb: dict[str, Any]) -> list[str]:
    """What differs in one manifest's locked inputs (``lock.json``'s ``locks.<name>``)."""
    lines: list[str] = []
    if la.get("variant") != lb.get("variant"):  # the packages it changed follow
        why = f" ({lb['variant_reason']})" if lb.get("variant_reason") else ""
        lines.append(f"{name}: variant {la.get('variant') or '(none)'} → {lb.get('variant') or '(none)'}{why}")
    if la.get("python") != lb.get("python"):
        lines.append(f"{name}: python {la.get('python')} → {lb.get('python')}")
    if la.get("interpreter") != lb.get("interpreter"):
        lines.append(f"{name}: interpreter {_interpreter(la)} → {_interpreter(lb)}")
    if la.get("code") != lb.get("code"):
        lines.append(f"{name}: code {la.get('code') or '(none)'} → {lb.get('code') or '(none)'}")
    lines += _mapping_diff(f"{name}: package", la.get("packages", {}), lb.get("packages", {}))
    sa, sb = la.get("sources", {}), lb.get("sources", {})
    for source in sorted(set(sa) | set(sb)):
        xa, xb = sa.get(source) or {}, sb.get(source) or {}
        if xa.get("commit") != xb.get("commit"):
            lines.append(f"{name}: source {source}: {xa.get('commit') or '(none)'} → {xb.get('commit') or '(none)'}")
        for key in ("install", "subdirectory", "repo"):
            if key in xa and key in xb and xa[key] != xb[key]:
                lines.append(f"{name}: source {source} {key}: {xa[key]} → {xb[key]}")
    wa, wb = la.get("weights", {}), lb.get("weights", {})
    for weights in sorted(set(wa) | set(wb)):
        lines += _mapping_diff(f"{name}: weights {weights}", wa.get(weights, {}), wb.get(weights, {}))
    inputs_differ = any(not line.startswith(f"{name}: code ") for line in lines)
    if la.get("environment") != lb.get("environment") and not inputs_differ:
        # Same interpreter, packages and sources, yet another environment: say so.
        lines.append(f"{name}: environment {la.get('environment')} → {lb.get('environment')}")
    return lines


def _interpreter(info: dict[str, Any]) -> str:
    """A run's interpreter store path, marked when it was a host copy standing in."""
    path = str(info.get("interpreter") or "(not recorded)")
    own = info.get("standing_in_for")
    return f"{path} (host copy, standing in for {own})" if own else path


def _launch_diff(
    la: dict[str, Any], lb: dict[str, Any], moved: dict[str, set[str]], *, asked_differs: bool
) -> list[str]:
    """What differs in how the services and the command were launched (``config.launch``).
    ``asked_differs``: the command as asked differs (its line says so; the argv it became
    is not repeated)."""
    lines: list[str] = []
    sa, sb = la.get("services") or {}, lb.get("services") or {}
    for service in sorted(set(sa) & set(sb)):
        xa, xb = sa[service], sb[service]
        argv_a, argv_b = _normal(xa.get("argv", []), xa), _normal(xb.get("argv", []), xb)
        if argv_a != argv_b:
            lines.append(f"{service}: command {_argv(argv_a)} → {_argv(argv_b)}")
        if _normal([xa.get("cwd", "")], xa) != _normal([xb.get("cwd", "")], xb):
            lines.append(
                f"{service}: working directory {_normal([xa.get('cwd', '')], xa)[0]} → "
                f"{_normal([xb.get('cwd', '')], xb)[0]}"
            )
        env_a, env_b = xa.get("env") or {}, xb.get("env") or {}
        for key in sorted(set(env_a) | set(env_b)):
            if key == "CUDA_VISIBLE_DEVICES" and "gpu" in moved.get(service, set()):
                continue  # the placement line says it
            if env_a.get(key) != env_b.get(key):
                lines.append(f"{service}: env {key}: {env_a.get(key, '(unset)')} → {env_b.get(key, '(unset)')}")
        lines += _environment_diff(service, xa, xb, skip=set(env_a) | set(env_b))
    ca, cb = la.get("command") or {}, lb.get("command") or {}
    if ca and cb:
        argv_a, argv_b = _normal(ca.get("argv", []), ca), _normal(cb.get("argv", []), cb)
        if argv_a != argv_b and not asked_differs:
            lines.append(f"run command: argv {_argv(argv_a)} → {_argv(argv_b)}")
        if _normal([ca.get("cwd", "")], ca) != _normal([cb.get("cwd", "")], cb):
            lines.append(
                f"run command: working directory {_normal([ca.get('cwd', '')], ca)[0]} → "
                f"{_normal([cb.get('cwd', '')], cb)[0]}"
            )
        env_a, env_b = ca.get("env") or {}, cb.get("env") or {}
        for key in sorted(set(env_a) | set(env_b)):
            if key in _PER_RUN_VARIABLES or _explained_url(key, moved):
                continue
            if key.endswith("_CLIENT") and key.startswith("HARNESS_SERVICE_"):
                # A client table names store paths ({python}, {weights}): by name without
                # their hash, as an argv does, so a bumped package is its own line alone.
                if _normal([env_a.get(key, "")], ca) == _normal([env_b.get(key, "")], cb):
                    continue
            if env_a.get(key) != env_b.get(key):
                lines.append(f"run command: env {key}: {env_a.get(key, '(unset)')} → {env_b.get(key, '(unset)')}")
        lines += _environment_diff(
            "run command", ca, cb, skip={k for k in (*env_a, *env_b) if k.startswith("HARNESS_")}
        )
    return lines


#: Variables a shell session, terminal or test runner sets that differ from one session to
#: the next and that no model reads: not compared in a launch's ``environment``.
SESSION_VARIABLES = frozenset(
    {
        "_",
        "OLDPWD",
        "PWD",
        "SHLVL",
        "TERM",
        "COLORTERM",
        "COLUMNS",
        "LINES",
        "PS1",
        "PS2",
        "PROMPT_COMMAND",
        "LS_COLORS",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "WINDOWID",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "PYTEST_CURRENT_TEST",
    }
)
#: Prefixes of the same kind (a login's SSH connection, a desktop session, a terminal's own).
SESSION_PREFIXES = ("SSH_", "XDG_SESSION_", "TERM_", "VSCODE_", "KITTY_", "ITERM_", "WT_")


def _environment_diff(label: str, a: dict[str, Any], b: dict[str, Any], *, skip: set[str]) -> list[str]:
    """What differs in two launches' ``environment`` (every variable the process saw), but
    the variables in ``skip`` (compared elsewhere), a run's own and a session's. A secret's
    value is recorded as a hash: its line says it changed and shows no value. Nothing when
    either record predates ``environment``."""
    env_a, env_b = a.get("environment"), b.get("environment")
    if not isinstance(env_a, dict) or not isinstance(env_b, dict):
        return []
    from harness.runtime.launch import is_secret_name, secret_hash_key_id

    lines = []
    for key in sorted(set(env_a) | set(env_b)):
        if key in skip or key in _PER_RUN_VARIABLES or key in SESSION_VARIABLES or key.startswith(SESSION_PREFIXES):
            continue
        va, vb = env_a.get(key), env_b.get(key)
        if va == vb:
            continue
        if is_secret_name(key) and va is not None and vb is not None:
            ka, kb = secret_hash_key_id(str(va)), secret_hash_key_id(str(vb))
            if ka != kb or ka is None:  # hashed under another user's key (or before keys): unknown
                lines.append(f"{label}: environment {key}: cannot compare (a secret hashed under another key)")
            else:
                lines.append(f"{label}: environment {key}: changed (a secret: its value is recorded as a hash only)")
        else:
            shown_a = "(unset)" if va is None else "(a secret)" if is_secret_name(key) else _short(va)
            shown_b = "(unset)" if vb is None else "(a secret)" if is_secret_name(key) else _short(vb)
            lines.append(f"{label}: environment {key}: {shown_a} → {shown_b}")
    return lines


def _with_project(launch: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``launch`` with the project folder set on each launch, and the run's own folder on
    the command's (the ``HARNESS_RUN_DIR`` it was given), for :func:`_normal`."""
    project = (config.get("project") or {}).get("root")
    services = {n: {**x, "project": project} for n, x in (launch.get("services") or {}).items()}
    command = launch.get("command")
    if command:
        # A worker given a remote simulator's address ({url}): the simulator's line says it.
        simulator = (config.get("simulator") or {}).get("url")
        command = {
            **command,
            "project": project,
            "run": (command.get("env") or {}).get("HARNESS_RUN_DIR"),
            **({"url": simulator} if simulator else {}),
        }
    return {"services": services, "command": command}


#: Variables that name this run itself (its folder, its broker's address and token), or that
#: another line compares (a remote simulator's address): never compared as variables.
_PER_RUN_VARIABLES = frozenset({"HARNESS_RUN_DIR", "HARNESS_BROKER", "HARNESS_BROKER_TOKEN", "HARNESS_SIMULATOR_URL"})


def _explained_url(key: str, moved: dict[str, set[str]]) -> bool:
    """``HARNESS_SERVICE_<NAME>_URL`` or ``_CLIENT`` (whose table holds the URL and port) of
    a service whose placement moved (its line says it)."""
    for service, keys in moved.items():
        prefix = "HARNESS_SERVICE_" + service.upper().replace("-", "_").replace(".", "_")
        if key in (prefix + "_URL", prefix + "_CLIENT") and keys & {"port", "url", "mode"}:
            return True
    return False


def _normal(texts: list[str], launch: dict[str, Any]) -> list[str]:
    """``texts`` with store paths as ``{store}/<name>`` (no hash), the run's own record
    folder as ``{run}`` (each run has another: a worker started in ``<run>/work`` or given
    ``{run}`` is launched alike), the project folder as ``{project}`` and the launch's own
    port and URL as ``{port}`` and ``{url}``: what is left is what the command itself says."""
    import re

    project = str(launch.get("project") or "")
    run = str(launch.get("run") or "")
    out = []
    url = str(launch.get("url") or "")
    port = str(launch.get("port") or "")
    for text in texts:
        text = re.sub(r"(?:/[^/\s]+)*/[0-9a-df-np-sv-z]{32}-", "{store}/", str(text))
        if run:  # before the project: a home inside the project holds the runs
            text = re.sub(rf"{re.escape(run)}(?=/|$)", "{run}", text)
        if project:
            text = re.sub(rf"{re.escape(project)}(?=/|$)", "{project}", text)
        if url:
            text = text.replace(url, "{url}")
        if port and port != "0":
            text = re.sub(rf"(?<!\d){re.escape(port)}(?!\d)", "{port}", text)
        out.append(text)
    return out


def _mapping_diff(label: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            lines.append(f"{label} {key}: {a.get(key, '(none)')} → {b.get(key, '(none)')}")
    return lines


def _argv(argv: list[str]) -> str:
    """A command line, whole (the difference may be at its end); a part with spaces quoted."""
    return " ".join(repr(part) if not part or any(c.isspace() for c in part) else part for part in argv)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def audit_variants(closure: dict[str, Any], root: Path) -> list[AuditItem]:
    """One item per manifest of a run's ``lock.json`` that ran an accelerator variant
    (:func:`harness.runs.groups.variant_verdict`), against its lock file when that still has
    the bytes the run recorded (``lock_blake3``)."""
    from harness.lock.lockfile import read
    from harness.runs.groups import variant_verdict
    from harness.store.hashing import file_blake3

    paths = {str(e["path"]) for e in closure.get("store_paths", [])}
    items = []
    for name, info in sorted((closure.get("locks") or {}).items()):
        if not isinstance(info, dict) or not info.get("variant"):
            continue
        lock_file = root / str(info.get("lock") or f"locks/{name}.lock.toml")
        lock, unread = None, f"lock file {lock_file} is gone"
        if lock_file.is_file():
            if file_blake3(lock_file) == info.get("lock_blake3"):
                lock = read(lock_file, whole=True)
            else:
                unread = f"lock file {lock_file} changed since the run"
        items.append(AuditItem(*variant_verdict(name, info, paths, lock, unread)))
    return items


def audit_targets(config: dict[str, Any], closure: dict[str, Any], root: Path) -> list[AuditItem]:
    """A cluster run's table of targets (``config.json``'s ``cluster.targets``, what each shard
    was judged against) derived again from the run's lock files, while they have the bytes the
    run recorded: one item, ``modified`` when the recorded table is not what they give."""
    from harness.lock.lockfile import read
    from harness.runs.groups import expected_targets
    from harness.store.hashing import file_blake3

    table = (config.get("cluster") or {}).get("targets")
    if not isinstance(table, dict) or not table:
        return []
    what = "cluster targets"
    locks = {}
    for name, info in sorted((closure.get("locks") or {}).items()):
        lock_file = root / str(info.get("lock") or f"locks/{name}.lock.toml")
        if not lock_file.is_file() or file_blake3(lock_file) != info.get("lock_blake3"):
            return [
                AuditItem(what, "ok", f"lock file {lock_file} changed since the run: the table is not derived again")
            ]
        locks[name] = read(lock_file, whole=True)
    derived = expected_targets(locks, closure)
    wrong = sorted(name for name in set(derived) | set(table) if derived.get(name) != table.get(name))
    if wrong:
        return [
            AuditItem(what, "modified", f"config.json's targets of {', '.join(wrong)} are not what the lock files give")
        ]
    count = sum(len(entries) for entries in derived.values())
    return [AuditItem(what, "ok", f"the {count} targets the shards were judged against, as the lock files give them")]


def audit_shards(run_dir: Path, head_closure: dict[str, Any]) -> list[AuditItem]:
    """One audit item per shard of a cluster run (:func:`judge_shard`, from the shard's
    ``shard.json``, ``lock.json`` and ``services/launch-checks.jsonl`` under ``shards/<I>/``,
    or the run's ``result.json`` where a shard has no folder), each against the closure of the
    targets (platform, variant) its record says it ran
    (:func:`harness.runs.groups.shard_expectation`); then the shards of each group against each
    other (:func:`harness.runs.groups.group_disagreements`)."""
    from harness.runs.groups import group_disagreements, shard_expectation
    from harness.store.launchcheck import read_launches

    config = read_json(run_dir / "config.json")
    count = int((config.get("cluster") or {}).get("shards") or 0)
    result_file = run_dir / "result.json"
    recorded = read_json(result_file).get("shards", []) if result_file.is_file() else []
    by_index = {s.get("index"): s for s in recorded if isinstance(s, dict)}
    items: list[AuditItem] = []
    members: dict[int, tuple[str, dict[str, Any]]] = {}  # shards judged ok: their group, closure
    for index in range(count):
        folder = run_dir / "shards" / str(index)
        summary = read_json(folder / "shard.json") if (folder / "shard.json").is_file() else by_index.get(index)
        closure = read_json(folder / "lock.json") if (folder / "lock.json").is_file() else None
        launches = list(read_launches(folder / "services"))
        expectation = shard_expectation(
            config.get("cluster") or {}, head_closure, closure, (summary or {}).get("targets")
        )
        item = judge_shard(
            index, count, summary, closure, launches, expectation.expected, problems=expectation.problems
        )
        if item.status == "ok" and closure is not None:
            members[index] = (expectation.group, closure)
        items.append(item)
    for index, why in group_disagreements(members).items():  # a group's own paths, node against node
        items[index] = AuditItem(items[index].path, "modified", why)
    return items


def judge_shard(
    index: int,
    count: int,
    summary: dict[str, Any] | None,
    closure: dict[str, Any] | None,
    launches: list[dict[str, Any]],
    head_closure: dict[str, Any],
    *,
    problems: Sequence[str] = (),
) -> AuditItem:
    """The audit's verdict on shard ``index`` of ``count``, pure: ``summary`` is its
    ``shard.json`` (None: the head recorded nothing of it), ``closure`` its ``lock.json``
    (None: it recorded none), ``launches`` its launch checks (:func:`read_launches`).

    ``head_closure`` is the closure expected of the shard: the head's, or that of the targets
    it ran (another variant, another platform; a content hash ``""`` where only the node knows
    it); ``problems`` what is wrong with the targets its record names (a variant its lock lacks,
    a reason that does not lead to it).

    In this order: a launch refused for changed bits (``modified``, naming the path and the
    files), targets the record cannot have run (``modified``, naming the problems), a closure
    other than the expected one (``modified``, naming each difference), a shard
    that did not end ``ok`` (``failed``, ``cancelled``; ``missing`` when no result came
    back), no closure recorded (``missing``); else ``ok``. Every verdict names the node and
    its home; a bad one, the reason the shard gave."""
    from harness.runs.closures import closure_differences

    summary = summary or {}
    where = f"shard {index}/{count} on {summary.get('hostname') or '?'} ({summary.get('home') or '?'})"
    reason = summary.get("reason") or ""
    status = summary.get("status")
    for entry in launches:
        refused = entry.get("refused")
        if isinstance(refused, dict):
            files = ", ".join(str(f) for f in refused.get("files") or []) or "its content"
            return AuditItem(
                where,
                "modified",
                f"refused at launch of {entry.get('launch')}: store path {refused.get('path')} changed "
                f"({files}; expected {refused.get('expected')}, found {refused.get('found')})",
                at_launch="refused",
            )
    if problems and (closure is not None or summary.get("targets")):
        return AuditItem(where, "modified", "its record names targets it cannot have run: " + "; ".join(problems))
    if closure is not None:
        differences = closure_differences(head_closure, closure)
        if differences:
            told = "; ".join(d.told("on the head", "on the node") for d in differences[:10])
            more = f" and {len(differences) - 10} more" if len(differences) > 10 else ""
            ran = (
                "refused before its first episode: its closure is not the head's"
                if summary.get("closure_refused")
                else "ran other bits than the head's closure"
            )
            return AuditItem(where, "modified", f"{ran}: {told}{more}")
    if not summary:
        return AuditItem(where, "missing", "the run's record holds nothing of this shard (the head stopped before it)")
    if summary.get("closure_refused"):  # refused before it realized: it recorded no closure
        return AuditItem(where, "modified", f"refused before its first episode: {reason or 'not the head closure'}")
    if status in ("failed", "cancelled"):
        return AuditItem(where, str(status), str(reason or f"the shard {status}"))
    if status != "ok":
        return AuditItem(where, "missing", f"no result came back ({status}): {reason or 'no reason given'}")
    if closure is None:
        return AuditItem(where, "missing", f"no closure recorded: {reason or 'no record'}")
    paths = head_closure.get("store_paths", [])
    unknown = sum(1 for e in paths if not e.get("content"))
    if unknown:  # another target than the head's: its own paths are checked by name here
        return AuditItem(
            where,
            "ok",
            f"same {len(paths)} store paths as its targets' closure, the head's content hashes for the "
            f"{len(paths) - unknown} it shares with the head",
        )
    return AuditItem(where, "ok", f"same {len(paths)} store paths and content hashes as the head's closure")
