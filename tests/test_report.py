"""Run reports (:mod:`harness.runs.report`): the page is rendered from a record as data, with
no process; it holds everything a reader needs and nothing it would have to fetch."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from harness.runs.report import ReportInput, read_events, render, write_events

T0 = 1_764_900_000.0


def record(**overrides: Any) -> ReportInput:
    config = {
        "id": "20261205-090000-000-abcd",
        "started": T0,
        "command": ["python", "agent.py", "--flag", "<script>alert(1)</script>"],
        "agent": {"name": "pointing", "skills": ["point"]},
        "benchmark": "reach",
        "services": ["molmo", "sam3", "vla"],
        "broker": {"shared": False},
        "versions": {"harness": "0.9.0"},
        "host": {"hostname": "gpu-box"},
        "plan": {
            "gpus": [{"index": 0, "name": "A", "total_gb": 24.0, "free_gb": 24.0}],
            "services": [
                {"name": "molmo", "mode": "on_demand", "gpu": 0, "vram_gb": 16.0, "swap": "big", "port": 1},
                {"name": "vla", "mode": "on_demand", "gpu": 0, "vram_gb": 12.0, "swap": "big", "port": 2},
                {"name": "sam3", "mode": "resident", "gpu": 0, "vram_gb": 6.0, "swap": None, "port": 3},
                {"name": "chat", "mode": "external", "gpu": None, "vram_gb": 0.0, "swap": None, "port": None},
            ],
            "notes": ["chat is external"],
        },
    }
    events = [
        {"seq": 1, "time": T0 + 1, "event": "start", "service": "molmo", "reason": "caller"},
        {"seq": 2, "time": T0 + 3, "event": "ready", "service": "molmo", "incarnation": 1},
        {"seq": 3, "time": T0 + 5, "event": "stop", "service": "molmo", "reason": "swap", "for": "vla"},
        {"seq": 4, "time": T0 + 6, "event": "stopped", "service": "molmo", "reason": "swap"},
        {"seq": 5, "time": T0 + 6.5, "event": "start", "service": "vla", "reason": "caller"},
        {"seq": 6, "time": T0 + 9, "event": "crash", "service": "vla", "error": "exit 1"},
        {"seq": 7, "time": T0 + 9.5, "event": "scoped_reset", "service": "vla", "client": "c1"},
    ]
    data: dict[str, Any] = {
        "run": "20261205-090000-000-abcd",
        "config": config,
        "result": {"ended": T0 + 10, "duration_s": 10.0, "exit_status": 0, "score": 0.5},
        "closure": {
            "store_paths": [
                {"path": "aaaa-env", "kind": "environment", "content": "blake3:1", "manifest": "vla"},
                {"path": "bbbb-weights", "kind": "weights", "content": "blake3:2", "manifest": "vla"},
                {"path": "cccc-gone", "kind": "wheel", "content": "blake3:3", "manifest": "sam3"},
            ],
            "project_files": {"services/servers/x.py": "sha256:00"},
        },
        "sizes": {"aaaa-env": 3 << 20, "bbbb-weights": 5 << 30, "cccc-gone": None},
        "audit": {
            "ok": True,
            "ok_strict": False,
            "verdict": "impure: 1 impurity (--strict fails on them); 3 checked, each as the run used it",
            "items": [],
            "impurities": ["vla: host interpreter stood in"],
            "scoped_resets": [{"time": T0 + 9.5, "service": "vla", "client": "c1", "incarnation": 2}],
        },
        "events": events,
        "benchmark": {
            "benchmark": "reach",
            "episodes": 2,
            "successes": 1,
            "success_rate": 0.5,
            "episode_results": [{"episode": 0, "success": True, "error_m": 0.001}, {"episode": 1, "success": False}],
        },
    }
    data.update(overrides)
    return ReportInput(**data)


class Collect(HTMLParser):
    """Every tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Collect:
    parser = Collect()
    parser.feed(page)
    parser.close()
    return parser


def test_the_report_is_one_self_contained_page_with_every_section() -> None:
    page = render(record())
    parsed = parse(page)
    text = " ".join("".join(parsed.text).split())
    # Self-contained: no script, nothing fetched (no src, no link, no remote href).
    assert not [t for t, _ in parsed.tags if t in ("script", "link", "img", "iframe")]
    assert not [a for _, a in parsed.tags if "src" in a or (a.get("href") or "").startswith(("http", "//"))]
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for heading in ("Outcome", "Audit", "Placement", "Timeline", "Closure", "Scores", "Compare"):
        assert ("h2", {}) in parsed.tags and heading in text, heading
    # The verdict, the impurity and the scoped reset.
    assert "impure: 1 impurity" in text and "vla: host interpreter stood in" in text
    assert 'class="verdict impure"' in page
    # Placement: one GPU bar; the swap group is one block as wide as its largest member (16 of 24 GB).
    gpu_rects = [a for t, a in parsed.tags if t == "rect" and a.get("fill") == "#eef1f4"]
    assert len(gpu_rects) == 1 and float(gpu_rects[0]["width"] or 0) == 570.0
    group = [a for t, a in parsed.tags if t == "rect" and a.get("fill") == "#f3c98b"]
    assert len(group) == 1 and float(group[0]["width"] or 0) == 380.0  # 16/24 of 570
    assert "molmo | vla" in text and "chat is external" in text
    # Timeline: molmo had a process from 1 s to 6 s, vla from 6.5 s until its crash at 9 s.
    spans = re.findall(r"<title>(\w+): ([0-9.]+)–([0-9.]+) s</title>", page)
    assert spans == [("molmo", "1.00", "6.00"), ("vla", "6.50", "9.00")], spans
    assert "crash at 9.00 s" in page and "scoped_reset at 9.50 s" in page
    # Closure with sizes, largest first, the total and what is gone.
    assert "3 store paths, 5.0 GiB in all (1 not in the store now)" in text
    assert text.index("bbbb-weights") < text.index("aaaa-env") < text.index("cccc-gone")
    assert "3.0 MiB" in text and "services/servers/x.py" in text
    # Scores per episode.
    assert "1 of 2 episodes succeeded" in text and "0.001" in text
    assert "harness diff 20261205-090000-000-abcd OTHER" in text


def test_a_report_without_events_audit_or_benchmark_says_so() -> None:
    page = render(
        record(events=(), audit=None, benchmark=None, result={}, diff=("other-run", ["svc: alpha 1.0 -> 2.0"]))
    )
    text = " ".join("".join(parse(page).text).split())
    assert "no broker events in this record" in text
    assert "not audited: harness audit 20261205-090000-000-abcd" in text
    assert "not ended" in text and "no benchmark.json" in text
    assert "Differences from other-run" in text and "svc: alpha 1.0 -&gt; 2.0" in page


def test_a_cluster_runs_shards_are_listed() -> None:
    shards = [
        {"index": 0, "shard": "0/2", "status": "ok", "score": 1.0, "node": "n1"},
        {"index": 1, "shard": "1/2", "status": "lost", "reason": "no result came back"},
    ]
    page = render(record(result={"exit_status": 1, "score": None, "shards": shards}, benchmark=None))
    assert re.search(r"<td>1/2</td><td>lost</td>.*no result came back", page)


def test_events_round_trip_through_the_record(tmp_path: Path) -> None:
    events = [{"seq": 1, "time": T0, "event": "start", "service": "svc"}]
    path = tmp_path / "services" / "events.jsonl"
    write_events(path, events)
    with open(path, "a") as handle:
        handle.write('{"torn": ')  # a line cut short is skipped
    assert read_events(path) == events
    assert read_events(tmp_path / "missing.jsonl") == []
    assert json.loads(path.read_text().splitlines()[0])["event"] == "start"
