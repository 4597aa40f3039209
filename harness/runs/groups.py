"""Nodes of one cluster run on other platforms and accelerator variants, each proven against the
closure of what it runs. Pure: data in, data out.

A run's shards need not all run what the head runs: a node with a CUDA 12.8 driver takes a
lock's cu128 variant where the head (no GPU) took cpu, an aarch64 robot computer takes the
lock's aarch64 target. So the head ships, with every shard, the table of every target each of
the run's locks holds (:func:`expected_targets`: per manifest, each (platform, variant) with
its store paths and their digest, built on the head's stand-in interpreter where one stands in
for that target's own, ``harness/lock/targets.py``). The node chooses its own target of each
lock exactly as realize does (:func:`choose_targets`: the first platform it runs, then
:func:`harness.lock.variants.choose_variant` with its own driver and ``HARNESS_VARIANT``, or
the run's forced variant), and a node whose machine the locks hold nothing for is refused at
once, naming what it is and what they offer. Its expected closure (:func:`group_closure`) is
those targets' store paths, with the head's content hash for every path the head realized too
(a path only this target has is checked by the node's own registration and launch checks, and
against the other shards of its group: ``harness/runs/audit.py``).

Shards that chose the same targets form a *group* (:func:`group_label`: ``x86_64-manylinux_2_28
cu128``); the record, ``audit`` and ``diff`` go by group.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.lock.document import Lock


@dataclass(frozen=True)
class NodeTarget:
    """The target of one lock a machine runs: its platform, variant ("" without variants)
    and why that variant ("" without variants)."""

    platform: str
    variant: str = ""
    reason: str = ""

    def as_json(self) -> dict[str, str]:
        return {"platform": self.platform, "variant": self.variant, "reason": self.reason}


class TargetRefused(HarnessError):
    """A node the run's locks hold no target for: refused before anything is realized."""


def standins_of(closure: Mapping[str, Any]) -> dict[str, str]:
    """Lock interpreter → the host copy that stood in for it, from a ``lock.json`` (or
    :func:`harness.runs.closures.expected_closure`)."""
    found: dict[str, str] = {}
    for info in (closure.get("locks") or {}).values():
        own, host = info.get("standing_in_for"), info.get("interpreter")
        if isinstance(own, str) and isinstance(host, str) and own and host and host != own:
            found[own] = host
    return found


def cache_gaps(table: Mapping[str, list[dict[str, Any]]], present: Collection[str]) -> list[dict[str, Any]]:
    """Every target of the run's locks (``table``: :func:`expected_targets`) of which a binary
    cache holding ``present`` lacks store paths: the lock, platform, variant, how many of how
    many paths are missing. The nodes that run such a target build those paths themselves.
    Pure."""
    gaps = []
    for name in sorted(table):
        for entry in table[name]:
            paths = [str(p) for p in entry.get("paths") or []]
            missing = [p for p in paths if p not in present]
            if missing:
                gaps.append(
                    {
                        "lock": name,
                        "platform": str(entry["platform"]),
                        "variant": str(entry.get("variant") or ""),
                        "missing": len(missing),
                        "paths": len(paths),
                    }
                )
    return gaps


def gap_note(gap: Mapping[str, Any], cache: str) -> str:
    """One line naming a target the cache lacks (:func:`cache_gaps`) and how to fill it from
    any machine of its platform: realizing another variant downloads and installs wheels, it
    needs no GPU. Pure."""
    variant = f" {gap['variant']}" if gap["variant"] else ""
    forced = f"--variant {gap['variant']} " if gap["variant"] else ""
    return (
        f"cache {cache} lacks {gap['missing']} of the {gap['paths']} store paths of {gap['lock']}{variant} "
        f"({gap['platform']}): nodes that run it build them before their shards start; to fill it first, run "
        f"`harness realize {forced}{gap['lock']}` and `harness store push {forced}{cache} {gap['lock']}` on a "
        "machine of that platform (no GPU needed)"
    )


def expected_targets(locks: Mapping[str, Lock], head_closure: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per manifest, every target its lock (``locks``: as written, every target) holds, with the
    store paths it realizes to and their digest, as JSON: built on the host copy the head used
    where one stood in for that target's own interpreter (same platform), else on the lock's
    own (module doc)."""
    from harness.lock.targets import target_paths

    standins = standins_of(head_closure)
    table: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(locks):
        table[name] = [
            {
                "platform": t.platform,
                "variant": t.variant,
                "cuda": t.cuda,
                "interpreter": t.interpreter,
                "standing_in_for": t.own_interpreter if t.interpreter != t.own_interpreter else None,
                "environment": t.environment,
                "paths": list(t.paths),
                "digest": t.digest,
            }
            for t in target_paths(locks[name], standins)
        ]
    return table


def offered(table: Mapping[str, list[dict[str, Any]]], name: str) -> str:
    """What the lock of ``name`` holds, in words: ``x86_64-manylinux_2_28 (cpu, cu128)``."""
    platforms: dict[str, list[str]] = {}
    for entry in table.get(name) or []:
        platforms.setdefault(str(entry["platform"]), []).append(str(entry["variant"]))
    return "; ".join(
        f"{platform} ({', '.join(v for v in variants if v)})" if any(variants) else platform
        for platform, variants in platforms.items()
    )


def choose_targets(
    table: Mapping[str, list[dict[str, Any]]],
    *,
    host_tags: list[str],
    driver: str | None,
    forced: str | None,
    here: str = "this node",
) -> dict[str, NodeTarget]:
    """The target of each manifest's lock a machine with platform tags ``host_tags``, an NVIDIA
    driver supporting CUDA ``driver`` (None: none) and ``HARNESS_VARIANT`` ``forced`` runs, as
    realize chooses it (:func:`harness.lock.platforms.host_platform_of`, then
    :func:`harness.lock.variants.choose_variant`). :class:`TargetRefused` naming ``here``,
    what it is and what each lock offers when a lock holds nothing it runs."""
    from harness.lock.platforms import fits_host
    from harness.lock.variants import DRIVER_VARIABLE, choose_variant

    chosen: dict[str, NodeTarget] = {}
    for name in sorted(table):
        entries = table[name]
        platforms = list(dict.fromkeys(str(e["platform"]) for e in entries))
        platform = next((p for p in platforms if fits_host(p, host_tags)), None)
        if platform is None:
            raise TargetRefused(
                f"{here} runs none of the platforms of lock {name}: it holds {offered(table, name)}",
                hint="run the shard on a machine of one of those platforms, or add this one to [lock] platforms "
                "and run `harness lock`",
            )
        variants = [(str(e["variant"]), e.get("cuda")) for e in entries if e["platform"] == platform and e["variant"]]
        if not variants:
            chosen[name] = NodeTarget(platform)
            continue
        try:
            choice = choose_variant(variants, driver=driver, forced=forced, what=f"lock {name}")
        except HarnessError as exc:
            drove = f"an NVIDIA driver for CUDA {driver}" if driver else "no NVIDIA driver"
            raise TargetRefused(
                f"{here} ({platform}, {drove}{f', HARNESS_VARIANT={forced}' if forced else ''}) runs no variant "
                f"of lock {name}, which holds {offered(table, name)}: {exc.message}",
                hint=exc.hint or f"run it where a variant fits, or say what the driver supports with {DRIVER_VARIABLE}",
            ) from None
        chosen[name] = NodeTarget(platform, choice.variant, choice.reason)
    return chosen


def recorded_targets(closure: Mapping[str, Any]) -> dict[str, NodeTarget]:
    """The target of each manifest a run's ``lock.json`` says it ran (its platform: ``platform``,
    or the last word of ``python`` in records before it; its variant and reason)."""
    found = {}
    for name, info in sorted((closure.get("locks") or {}).items()):
        if not isinstance(info, dict):
            continue
        platform = info.get("platform") or str(info.get("python") or "").rsplit(" ", 1)[-1]
        found[str(name)] = NodeTarget(
            str(platform), str(info.get("variant") or ""), str(info.get("variant_reason") or "")
        )
    return found


def group_label(targets: Mapping[str, NodeTarget]) -> str:
    """The group of shards that chose ``targets``: their platform(s), and the variant when every
    lock with variants took the same one (else each lock's, ``svc=cu128``)."""
    platforms = ", ".join(sorted({t.platform for t in targets.values()})) or "(no locks)"
    variants = {name: t.variant for name, t in sorted(targets.items()) if t.variant}
    if not variants:
        return platforms
    if len(set(variants.values())) == 1:
        return f"{platforms} {next(iter(variants.values()))}"
    return f"{platforms} " + ", ".join(f"{name}={variant}" for name, variant in variants.items())


def _entry(table: Mapping[str, list[dict[str, Any]]], name: str, target: NodeTarget) -> dict[str, Any] | None:
    return next(
        (e for e in table.get(name) or [] if e["platform"] == target.platform and e["variant"] == target.variant), None
    )


def target_problems(
    table: Mapping[str, list[dict[str, Any]]], targets: Mapping[str, NodeTarget], forced: str | None = None
) -> list[str]:
    """What is wrong with a shard (or run) saying it ran ``targets``: a manifest the table lacks
    or lacks the target of, a variant its reason does not lead to
    (:func:`harness.lock.variants.reason_problem`), a variant other than the run's forced one."""
    from harness.lock.variants import reason_problem

    problems = []
    for name, target in sorted(targets.items()):
        if name not in table:
            problems.append(f"{name}: not one of the run's locks")
            continue
        if _entry(table, name, target) is None:
            what = f"{target.platform}{f' ({target.variant})' if target.variant else ''}"
            problems.append(f"{name}: {what} is no target of its lock, which holds {offered(table, name)}")
            continue
        if not target.variant:
            continue
        variants = [(str(e["variant"]), e.get("cuda")) for e in table[name] if e["platform"] == target.platform]
        problem = reason_problem(variants, target.variant, target.reason)
        if problem:
            problems.append(f"{name}: {problem}")
        elif forced and target.variant != forced:
            problems.append(f"{name}: variant {target.variant}, but the run forced {forced}")
    return problems


def group_closure(
    head: Mapping[str, Any], table: Mapping[str, list[dict[str, Any]]], targets: Mapping[str, NodeTarget]
) -> dict[str, Any]:
    """The closure a node that chose ``targets`` must realize, shaped as
    :func:`harness.runs.closures.expected_closure`: every store path of those targets and each
    manifest's code, with the head's content hash (``head``: its expected closure) where the
    head has the path and ``""`` (not known before it is built) where not; per manifest the
    interpreter and environment of the target. Raises HarnessError for a target the table lacks."""
    contents = {str(e["path"]): str(e["content"]) for e in head.get("store_paths", [])}
    head_locks = head.get("locks") or {}
    paths: dict[str, str] = {}
    locks: dict[str, dict[str, Any]] = {}
    for name, target in sorted(targets.items()):
        entry = _entry(table, name, target)
        if entry is None:
            raise HarnessError(f"lock {name} holds no target {target.platform} {target.variant}".rstrip())
        info = dict(head_locks.get(name) or {})
        for path in [*entry["paths"], *([info["code"]] if info.get("code") else [])]:
            paths.setdefault(str(path), contents.get(str(path), ""))
        implementation_version = str(info.get("python") or "").rsplit(" ", 1)[0]
        info.update(
            interpreter=entry["interpreter"],
            standing_in_for=entry.get("standing_in_for"),
            environment=entry["environment"],
            python=f"{implementation_version} {target.platform}".strip(),
        )
        locks[name] = info
    return {"store_paths": [{"path": p, "content": paths[p]} for p in sorted(paths)], "locks": locks}


@dataclass(frozen=True)
class Expectation:
    """What one shard of a cluster run is judged against: the closure of the targets it ran
    (:func:`group_closure`), those targets, its group, and what is wrong with its record's
    targets themselves (then ``expected`` is the head's closure)."""

    expected: dict[str, Any]
    targets: dict[str, NodeTarget]
    group: str
    problems: list[str]


def shard_expectation(
    cluster: Mapping[str, Any],
    head_closure: Mapping[str, Any],
    shard_closure: Mapping[str, Any] | None,
    reported: Mapping[str, Any] | None = None,
) -> Expectation:
    """What a shard is judged against (:class:`Expectation`), from the run's ``config.json``
    ``cluster`` (its ``targets`` table, the variant it forced), the head's ``lock.json``, the
    shard's own ``lock.json`` (None: it recorded none) and the targets its node reported (a
    shard refused before it realized). The targets are read from what the shard recorded, so
    a record that names another variant than its paths are is judged against that variant.
    A record of a run before targets were shipped is judged against the head's closure."""
    from harness.runs.closures import expected_closure

    head = expected_closure(dict(head_closure))
    if shard_closure is not None:
        targets = recorded_targets(shard_closure)
    elif reported:
        targets = {str(n): NodeTarget(**{k: str(v) for k, v in dict(t).items()}) for n, t in reported.items()}
    else:
        targets = recorded_targets(head_closure)
    label = group_label(targets)
    table = cluster.get("targets")
    if not isinstance(table, dict) or not table:
        return Expectation(head, targets, label, [])
    forced = cluster.get("variant")
    problems = [f"{name}: its lock is not in the record" for name in sorted(set(table) - set(targets))]
    problems += target_problems(table, targets, forced)
    if problems:
        return Expectation(head, targets, label, problems)
    return Expectation(group_closure(head, table, targets), targets, label, [])


def group_disagreements(members: Mapping[int, tuple[str, Mapping[str, Any]]]) -> dict[int, str]:
    """Shards of one group whose bits differ from the rest of the group's (``members``: shard
    index → (group, its ``lock.json``)), each told: where two shards of a group hold one store
    path with other content hashes, the content most of them hold stands (the lowest index's on
    a tie) and the others are named. Paths the head also realized are checked against the head
    already; this catches a path only the group has (its variant's environment) built to other
    bits on one node. Pure."""
    from collections import Counter

    from harness.runs.closures import readable

    groups: dict[str, dict[int, dict[str, str]]] = {}
    for index, (group, closure) in members.items():
        paths = {str(e["path"]): str(e["content"]) for e in closure.get("store_paths", [])}
        groups.setdefault(group, {})[index] = paths
    told: dict[int, str] = {}
    for group, shards in sorted(groups.items()):
        if len(shards) < 2:
            continue
        for path in sorted({p for paths in shards.values() for p in paths}):
            held = {i: paths[path] for i, paths in sorted(shards.items()) if path in paths}
            counts = Counter(held.values())
            if len(counts) < 2:
                continue
            first = {content: min(i for i, c in held.items() if c == content) for content in counts}
            common = max(counts, key=lambda c: (counts[c], -first[c]))
            agree = [str(i) for i, c in held.items() if c == common]
            for index, content in held.items():
                if content != common and index not in told:
                    told[index] = (
                        f"other bits than shard(s) {', '.join(agree)} of its group {group}: "
                        f"{readable(path)} is {content} here, {common} there"
                    )
    return told


def shard_groups(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``result.json``'s ``groups``: per group the shards in it, the digest of the store paths
    expected of it and the closure digests its shards recorded. Pure."""
    groups: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        label = summary.get("group")
        if not label:
            continue
        group = groups.setdefault(
            str(label),
            {"targets": summary.get("targets"), "expected_digest": summary.get("expected_digest"), "shards": []},
        )
        group["shards"].append(summary.get("index"))
        digests = group.setdefault("closure_digests", [])
        if summary.get("closure_digest") and summary["closure_digest"] not in digests:
            digests.append(summary["closure_digest"])
    return dict(sorted(groups.items()))


def variant_verdict(
    name: str, info: Mapping[str, Any], closure_paths: set[str], lock: Lock | None, unread: str = ""
) -> tuple[str, str, str]:
    """(what, status, detail) of the variant a run's ``lock.json`` says manifest ``name`` ran
    (``info``: its ``locks.<name>``), pure. With ``lock`` (the lock file as written, the bytes the
    run recorded): the variant must be one it holds for the recorded platform, the reason must
    lead to it (:func:`harness.lock.variants.reason_problem`), and the recorded interpreter,
    environment and store paths must be that variant's projection (``modified`` naming what is
    not). Without (``unread`` says why): the reason is checked against the variants the record
    names, and the detail says the projection was not."""
    from harness.lock.projection import variants_of
    from harness.lock.targets import target_paths
    from harness.lock.variants import reason_problem

    target = recorded_targets({"locks": {name: dict(info)}})[name]
    what = f"{name}: variant {target.variant}"
    if lock is None:
        listed = [(str(v[0]), v[1]) for v in info.get("variants") or [] if isinstance(v, list) and v]
        problem = reason_problem(listed, target.variant, target.reason) if listed else None
        if problem:
            return what, "modified", problem
        return what, "ok", f"{target.reason} ({unread}: not re-checked as that variant's projection)"
    problem = reason_problem(variants_of(lock, target.platform), target.variant, target.reason)
    if problem:
        return what, "modified", f"the record says {problem}"
    standins = {str(info["standing_in_for"]): str(info["interpreter"])} if info.get("standing_in_for") else {}
    built = next(
        t for t in target_paths(lock, standins) if (t.platform, t.variant) == (target.platform, target.variant)
    )
    wrong = [
        f"{key} {info.get(key)} recorded, {target.variant}'s is {value}"
        for key, value in (("interpreter", built.interpreter), ("environment", built.environment))
        if info.get(key) != value
    ]
    absent = [p for p in built.paths if p not in closure_paths]
    if absent:
        wrong.append(f"{len(absent)} of its store paths are not in the closure ({', '.join(absent[:3])})")
    if wrong:
        return what, "modified", f"the closure is not {target.variant}'s projection of the lock: " + "; ".join(wrong)
    return what, "ok", f"{target.reason}; the closure is that variant's {len(built.paths)} store paths"
