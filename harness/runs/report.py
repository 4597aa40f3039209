"""A run's report: one self-contained HTML page (``harness report RUN``; the web UI links it).

:func:`render` is pure: a :class:`ReportInput` (the record's files as read, the sizes of its
store paths, the audit, the broker's events, a diff) in, an HTML string out. It shows the
run's outcome and audit verdict, the placement on the GPUs as a picture (SVG), the service
timeline (from the broker's events, where the record has them), the closure with sizes,
impurities, scoped resets, scores per episode or shard, and ``harness diff`` against
another run when asked. No script, no external file: the page opens from disk, mail or a
cluster's shared folder alike, and every value is escaped.

:func:`gather` reads a record (the I/O edge) and :func:`write_report` puts the page at
``<run>/report.html``, where the broker's UI serves it from (``/ui/runs/ID/report``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

#: Where a run keeps its broker's events (one JSON object a line), for the timeline: every
#: event of its own broker, or those of ``harness up``'s broker while the run was joined.
EVENTS_FILE = "services/events.jsonl"
#: The report's file in the run's folder.
REPORT_FILE = "report.html"
#: Rows of the event table at most (the timeline picture shows every event).
EVENT_ROWS = 500

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;padding:0 1em;color:#222}
h1{font-size:1.3em}h2{font-size:1.05em;margin-top:1.8em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #e3e3e3;padding:.2em .5em;text-align:left;
vertical-align:top}th{background:#f0f2f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,monospace;font-size:.92em}.verdict{padding:.3em .6em;border-radius:4px}
.ok{background:#c9ecd4}.bad{background:#f6c4c4}.impure{background:#fbe8a6}dl{display:grid;
grid-template-columns:max-content auto;gap:.1em 1em}dt{font-weight:600}dd{margin:0}.muted{color:#777}
"""

_EVENT_COLOURS = {"crash": "#d33", "start_failed": "#d33", "scoped_reset": "#e80", "refused": "#a3a"}


@dataclass(frozen=True)
class ReportInput:
    """What a report shows, as read from a run's record."""

    run: str
    config: Mapping[str, Any]
    result: Mapping[str, Any]  # {} while the run has not ended
    closure: Mapping[str, Any]  # lock.json
    sizes: Mapping[str, int | None] = field(default_factory=dict)  # store path -> bytes (None: gone)
    audit: Mapping[str, Any] | None = None  # AuditReport.as_json() with "verdict"
    events: Sequence[Mapping[str, Any]] = ()  # the broker's events during the run
    benchmark: Mapping[str, Any] | None = None  # benchmark.json
    diff: tuple[str, Sequence[str]] | None = None  # (the other run, harness diff's lines)


# ------------------------------------------------------------------------------ render


def render(data: ReportInput) -> str:
    """The report of ``data`` as one HTML document (pure)."""
    sections = [
        _summary(data),
        _audit(data),
        _placement(data.config.get("plan") or {}),
        _timeline(data.events, _number(data.config.get("started"))),
        _closure(data.closure, data.sizes),
        _scores(data.benchmark, data.result),
        _diff(data),
    ]
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>run {escape(data.run)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>Run <code>{escape(data.run)}</code></h1>\n" + "\n".join(s for s in sections if s) + "\n</body></html>\n"
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _when(value: object) -> str:
    stamp = _number(value)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp)) if stamp is not None else "—"


def _size(value: int | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _cell(value: object) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    if isinstance(value, (dict, list)):
        return f"<code>{escape(json.dumps(value, sort_keys=True))}</code>"
    return escape(str(value))


def _table(head: Iterable[str], rows: Iterable[Iterable[object]], numeric: Iterable[int] = ()) -> str:
    right = set(numeric)
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in right else ''}>{_cell(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def _summary(data: ReportInput) -> str:
    config, result = data.config, data.result
    agent = config.get("agent") or {}
    command = config.get("command") or []
    facts: list[tuple[str, object]] = [
        ("command", " ".join(str(c) for c in command) if isinstance(command, list) else command),
        ("agent", agent.get("name") if isinstance(agent, dict) else None),
        ("benchmark", config.get("benchmark")),
        ("services", ", ".join(config.get("services") or []) or None),
        ("started", _when(config.get("started"))),
        ("ended", _when(result.get("ended")) if result else "not ended (or not recorded)"),
        ("duration", f"{result['duration_s']:.1f} s" if _number(result.get("duration_s")) is not None else None),
        ("exit status", result.get("exit_status")),
        ("score", result.get("score")),
        ("broker", "harness up's (joined)" if (config.get("broker") or {}).get("shared") else "the run's own"),
        ("harness", (config.get("versions") or {}).get("harness")),
        ("host", (config.get("host") or {}).get("hostname")),
    ]
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{_cell(v)}</dd>" for k, v in facts)
    return f"<h2>Outcome</h2><dl>{rows}</dl>"


def _audit(data: ReportInput) -> str:
    audit = data.audit
    if audit is None:
        return "<h2>Audit</h2><p class=muted>not audited: <code>harness audit " + escape(data.run) + "</code></p>"
    verdict = str(audit.get("verdict", ""))
    kind = "ok" if audit.get("ok_strict") else "impure" if audit.get("ok") else "bad"
    parts = [f'<h2>Audit</h2><p><span class="verdict {kind}">{escape(verdict)}</span></p>']
    bad = [i for i in audit.get("items", []) if i.get("status") != "ok"]
    if bad:
        parts.append(_table(["path", "status", "detail"], ([i["path"], i["status"], i.get("detail")] for i in bad)))
    impurities = list(audit.get("impurities", []))
    parts.append(
        "<h3>Impurities</h3>"
        + (
            "<ul>" + "".join(f"<li>{escape(str(i))}</li>" for i in impurities) + "</ul>"
            if impurities
            else "<p>none</p>"
        )
    )
    resets = list(audit.get("scoped_resets", []))
    parts.append("<h3>Scoped resets</h3>")
    if resets:
        parts.append(
            _table(
                ["time", "service", "client", "incarnation", "previous"],
                (
                    [
                        _when(r.get("time")),
                        r.get("service"),
                        r.get("client"),
                        r.get("incarnation"),
                        r.get("previous_incarnation"),
                    ]
                    for r in resets
                ),
            )
        )
    else:
        parts.append("<p>none: no scoped service lost its memory during the run</p>")
    return "".join(parts)


def _placement(plan: Mapping[str, Any]) -> str:
    """The GPUs as bars as wide as their memory, each service a block as wide as its
    ``vram_gb`` (a swap group one block: its members take turns); the rest listed."""
    services = [s for s in plan.get("services", []) if isinstance(s, dict)]
    gpus = [g for g in plan.get("gpus", []) if isinstance(g, dict)]
    rows = _table(
        ["service", "mode", "GPU", "VRAM (GB)", "swap group", "port", "why"],
        (
            [
                s.get("name"),
                s.get("mode"),
                s.get("gpu"),
                s.get("vram_gb"),
                s.get("swap"),
                s.get("port"),
                s.get("reason"),
            ]
            for s in services
        ),
    )
    width, row_h, label_w = 720.0, 46, 150
    svg = []
    for row, gpu in enumerate(gpus):
        total = _number(gpu.get("total_gb")) or 1.0
        y = row * row_h + 4
        scale = (width - label_w) / total
        svg.append(f'<text x="0" y="{y + 24}">GPU {escape(str(gpu.get("index")))} ({total:g} GB)</text>')
        svg.append(
            f'<rect x="{label_w}" y="{y}" width="{width - label_w:.1f}" height="34" fill="#eef1f4" stroke="#999"/>'
        )
        x = float(label_w)
        blocks: dict[str, list[Mapping[str, Any]]] = {}
        for service in services:
            if service.get("gpu") == gpu.get("index") and service.get("mode") in ("resident", "on_demand"):
                blocks.setdefault(str(service.get("swap") or f"\0{service.get('name')}"), []).append(service)
        for key, members in blocks.items():
            size = max(_number(m.get("vram_gb")) or 0.0 for m in members)
            w = max(size * scale, 2.0)
            names = " | ".join(str(m.get("name")) for m in members)
            title = f"{names}: {size:g} GB" + (
                f" (swap group {key}, one at a time)" if not key.startswith("\0") else ""
            )
            fill = "#9cc7ef" if key.startswith("\0") else "#f3c98b"
            svg.append(
                f'<g><title>{escape(title)}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="34" '
                f'fill="{fill}" stroke="#345"/><text x="{x + 4:.1f}" y="{y + 22}" font-size="12">{escape(names)}</text></g>'
            )
            x += w
    picture = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{len(gpus) * row_h + 8}" '
        f'font-family="system-ui,sans-serif" font-size="13" role="img" aria-label="placement">{"".join(svg)}</svg>'
        if gpus
        else "<p class=muted>no GPU in the plan: every service on CPU, external or off</p>"
    )
    notes = "".join(f"<li>{escape(str(n))}</li>" for n in plan.get("notes", []))
    return "<h2>Placement</h2>" + picture + rows + (f"<ul>{notes}</ul>" if notes else "")


def _spans(events: Sequence[Mapping[str, Any]], end: float) -> dict[str, list[tuple[float, float]]]:
    """Per service, the times it had a process (a start to its stop), from the events."""
    open_at: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        service, at, kind = event.get("service"), _number(event.get("time")), event.get("event")
        if not isinstance(service, str) or at is None:
            continue
        spans.setdefault(service, [])
        if kind == "start":
            open_at.setdefault(service, at)
        elif kind in ("stopped", "start_failed", "crash") and service in open_at:
            spans[service].append((open_at.pop(service), at))
    for service, at in open_at.items():
        spans[service].append((at, end))
    return spans


def _timeline(events: Sequence[Mapping[str, Any]], started: float | None) -> str:
    if not events:
        return (
            "<h2>Timeline</h2><p class=muted>no broker events in this record (a record made before "
            "runs kept them, or a run whose broker could not hand them over)</p>"
        )
    times = [t for t in (_number(e.get("time")) for e in events) if t is not None]
    t0 = started if started is not None else min(times)
    end = max(times + [t0 + 1e-3])
    spans = _spans(events, end)
    width, label_w, lane = 720.0, 150, 22
    scale = (width - label_w) / max(end - t0, 1e-3)
    svg = []
    for row, (service, periods) in enumerate(sorted(spans.items())):
        y = row * lane + 4
        svg.append(f'<text x="0" y="{y + 14}">{escape(service)}</text>')
        svg.append(f'<line x1="{label_w}" x2="{width}" y1="{y + 9}" y2="{y + 9}" stroke="#ddd"/>')
        for a, b in periods:
            svg.append(
                f'<rect x="{label_w + (a - t0) * scale:.1f}" y="{y + 2}" width="{max((b - a) * scale, 1.5):.1f}" '
                f'height="14" fill="#9cc7ef"><title>{escape(service)}: {a - t0:.2f}–{b - t0:.2f} s</title></rect>'
            )
        for event in events:
            colour = _EVENT_COLOURS.get(str(event.get("event")))
            at = _number(event.get("time"))
            if event.get("service") == service and colour and at is not None:
                svg.append(
                    f'<circle cx="{label_w + (at - t0) * scale:.1f}" cy="{y + 9}" r="4" fill="{colour}">'
                    f"<title>{escape(str(event.get('event')))} at {at - t0:.2f} s</title></circle>"
                )
    axis_y = len(spans) * lane + 18
    svg.append(f'<text x="{label_w}" y="{axis_y}" fill="#777">0 s (the run started)</text>')
    svg.append(f'<text x="{width}" y="{axis_y}" fill="#777" text-anchor="end">{end - t0:.1f} s</text>')
    picture = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{axis_y + 6}" '
        f'font-family="system-ui,sans-serif" font-size="12" role="img" aria-label="timeline">{"".join(svg)}</svg>'
    )
    skip = {"seq", "time", "event", "service"}
    rows = [
        [
            f"{(_number(e.get('time')) or t0) - t0:.3f}",
            e.get("event"),
            e.get("service"),
            " ".join(f"{k}={v}" for k, v in e.items() if k not in skip and v is not None),
        ]
        for e in events[:EVENT_ROWS]
    ]
    more = f"<p class=muted>{len(events) - EVENT_ROWS} more events not listed</p>" if len(events) > EVENT_ROWS else ""
    legend = "<p class=muted>blue: the service had a process; red: a crash or failed start; orange: a scoped reset</p>"
    return "<h2>Timeline</h2>" + picture + legend + _table(["s", "event", "service", "detail"], rows, [0]) + more


def _closure(closure: Mapping[str, Any], sizes: Mapping[str, int | None]) -> str:
    entries = [e for e in closure.get("store_paths", []) if isinstance(e, dict)]
    known = [sizes.get(e["path"]) for e in entries if sizes.get(e["path"]) is not None]
    total = sum(v for v in known if v is not None)
    per_manifest: dict[str, int] = {}
    for entry in entries:
        per_manifest[entry.get("manifest", "?")] = per_manifest.get(entry.get("manifest", "?"), 0) + (
            sizes.get(entry["path"]) or 0
        )
    rows = (
        [
            e["path"],
            e.get("kind"),
            e.get("manifest"),
            _size(sizes.get(e["path"])),
            str(e.get("content", ""))[:20],
            e.get("impure"),
        ]
        for e in sorted(entries, key=lambda e: -(sizes.get(e["path"]) or 0))
    )
    summary = ", ".join(f"{escape(name)} {_size(size)}" for name, size in sorted(per_manifest.items()))
    files = closure.get("project_files") or {}
    project = (
        "<h3>Project files used from the checkout</h3>" + _table(["file", "sha256"], sorted(files.items()))
        if files
        else ""
    )
    return (
        f"<h2>Closure</h2><p>{len(entries)} store paths, {_size(total)} in all"
        + (f" ({len(entries) - len(known)} not in the store now)" if len(known) < len(entries) else "")
        + (f"; per manifest: {summary}" if summary else "")
        + "</p>"
        + _table(["store path", "kind", "manifest", "size", "content", "impure"], rows, [3])
        + project
    )


def _scores(benchmark: Mapping[str, Any] | None, result: Mapping[str, Any]) -> str:
    parts = ["<h2>Scores</h2>"]
    if benchmark:
        parts.append(
            f"<p>{_cell(benchmark.get('benchmark'))}: {_cell(benchmark.get('successes'))} of "
            f"{_cell(benchmark.get('episodes'))} episodes succeeded (success rate {_cell(benchmark.get('success_rate'))})</p>"
        )
        episodes = [e for e in benchmark.get("episode_results", []) if isinstance(e, dict)]
        if episodes:
            keys = sorted({k for e in episodes for k in e}, key=lambda k: (k != "episode", k != "success", k))
            parts.append(_table(keys, ([e.get(k) for k in keys] for e in episodes)))
    shards = [s for s in result.get("shards", []) if isinstance(s, dict)]
    if shards:
        parts.append(
            "<h3>Shards</h3>"
            + _table(
                ["shard", "status", "score", "node", "reason"],
                ([s.get("shard"), s.get("status"), s.get("score"), s.get("node"), s.get("reason")] for s in shards),
            )
        )
    if len(parts) == 1:
        parts.append(f"<p>score: {_cell(result.get('score'))} (no benchmark.json in the record)</p>")
    return "".join(parts)


def _diff(data: ReportInput) -> str:
    if data.diff is None:
        return (
            "<h2>Compare</h2><p>What differs from another run: "
            f"<code>harness diff {escape(data.run)} OTHER</code>, or "
            f"<code>harness report {escape(data.run)} --diff OTHER</code> to put it here.</p>"
        )
    other, lines = data.diff
    body = (
        "<ul>" + "".join(f"<li><code>{escape(line)}</code></li>" for line in lines) + "</ul>"
        if lines
        else "<p>the runs computed with the same closure, placement and configuration</p>"
    )
    return f"<h2>Differences from <code>{escape(other)}</code></h2>{body}"


# ------------------------------------------------------------------------------ I/O edge


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events a run's broker left (one JSON object a line); [] when none; a torn line is skipped."""
    from harness.store.entries import read_regular

    raw = read_regular(path)  # never a link, a fifo, a huge file
    lines = raw.decode("utf-8", errors="replace").splitlines() if raw is not None else []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def write_events(path: Path, events: Iterable[Mapping[str, Any]]) -> None:
    """Write the broker's events of a run (atomically; readable by the record's owner)."""
    from harness.runs.record import open_record_file

    temp = path.with_name(f".{path.name}.tmp")
    with open_record_file(temp) as sink:  # writable by this user only, in a shared home too
        sink.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in events).encode("utf-8"))
    temp.replace(path)


def gather(run_dir: Path, store_root: Path, *, audit: bool = True, diff_with: Path | None = None) -> ReportInput:
    """Read what the report of ``run_dir`` shows: its record, the sizes of its store paths
    (from the store's records), its audit (re-hashing, as ``harness audit`` does) and, with
    ``diff_with``, ``harness diff``'s lines against that run."""
    from harness.runs.audit import audit_run, diff_runs
    from harness.runs.record import read_json
    from harness.store.store import Store

    config = read_json(run_dir / "config.json")
    closure = read_json(run_dir / "lock.json")
    result = read_json(run_dir / "result.json") if (run_dir / "result.json").is_file() else {}
    benchmark = read_json(run_dir / "benchmark.json") if (run_dir / "benchmark.json").is_file() else None
    store = Store(store_root)
    sizes: dict[str, int | None] = {}
    for entry in closure.get("store_paths", []):
        record = store.record(entry["path"])
        sizes[entry["path"]] = record.nar_size if record is not None else None
    verdict: dict[str, Any] | None = None
    if audit:
        report = audit_run(run_dir, store_root, None)
        verdict = {**report.as_json(), "verdict": report.verdict(strict=False)}
        if report.fails(strict=True) and not report.failed:
            verdict["verdict"] = report.verdict(strict=True)
    diff = (diff_with.name, diff_runs(run_dir, diff_with)) if diff_with is not None else None
    return ReportInput(
        run=run_dir.name,
        config=config,
        result=result,
        closure=closure,
        sizes=sizes,
        audit=verdict,
        events=read_events(run_dir / EVENTS_FILE),
        benchmark=benchmark,
        diff=diff,
    )


def write_report(
    run_dir: Path, store_root: Path, out: Path | None = None, *, audit: bool = True, diff_with: Path | None = None
) -> Path:
    """Render the report of ``run_dir`` to ``out`` (default ``<run>/report.html``); its path."""
    target = out if out is not None else run_dir / REPORT_FILE
    page = render(gather(run_dir, store_root, audit=audit, diff_with=diff_with))
    from harness.runs.record import open_record_file

    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # Writable by this user only, in a shared home too, and never a file another user made.
    with open_record_file(temp, fresh=True) as sink:
        sink.write(page.encode("utf-8"))
    temp.replace(target)
    return target
