"""The GPU check (issue 31, step 6): what the runtime does with a real GPU, end to end, in a
few minutes, on a machine that may have no network at all. CI never runs it (no GPU there);
run it whenever a GPU machine is at hand and record what it printed in docs/benchmarks.md.

    bash scripts/device-check.sh [--gb 2] [--out DIR] [--host]

On a GPU machine without network, bring a venv made by ``scripts/bootstrap.sh`` along
(``HARNESS_VENV`` names it); the check itself needs nothing from any index.

Phases, each printing ``ok`` or ``FAIL`` lines (exit 1 on any FAIL):

1. **inventory**: NVML's GPUs as harness sees them (``detect_gpus``) against ``nvidia-smi``
   where it is installed: count, names, total memory.
2. **project**: a throwaway project with two services, ``hog-a`` and ``hog-b``, each holding
   ``--gb`` GiB on its GPU through the CUDA driver (``scripts/device/hog.py``: ctypes and the
   standard library, so no wheel is needed offline), in one swap group on GPU 0; and
   ``hog-big``, which asks for more than GPU 0 has free right now.
3. **lock and realize** it offline into an empty home (a host copy of this interpreter
   stands in for the lock's).
4. **placement against live free memory**: ``plan`` puts the hogs on GPU 0 and ``hog-big``
   off, naming the free memory.
5. **broker**: ``harness up``; acquire ``hog-a`` (its start and load time; ``status`` counts
   its GPU memory by pid; NVML's free memory drops by about ``--gb``); acquire ``hog-b``: a
   swap (A stopped, its memory back, then B started: the swap's wait beside B's own load).
6. **down**: every hog process gone, the GPU's free memory back where it started.

``--host`` runs the same flow on a machine without a GPU, holding host memory (the GPU
figures are skipped, saying so): tests/test_device_check.py runs it that way in CI. Without a
GPU and without ``--host`` it prints that there is nothing to check and exits 0.
``--out DIR`` writes ``device-check.json`` there (every figure and line).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client import Client  # noqa: E402
from harness.runtime.inventory import detect_gpus, gpu_memory_by_pid  # noqa: E402

_GIB = 1024**3


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    failed: bool = False

    def check(self, ok: bool, what: str) -> bool:
        line = f"{'ok  ' if ok else 'FAIL'}  {what}"
        print(line, flush=True)
        self.lines.append(line)
        self.failed |= not ok
        return ok

    def note(self, what: str) -> None:
        line = f"      {what}"
        print(line, flush=True)
        self.lines.append(line)


def _harness(
    project: Path, home: Path, deploy: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "harness", "--project", str(project), "--home", str(home), "--deploy", str(deploy)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, check=False)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_gb(index: int) -> float | None:
    gpus = {g.index: g for g in detect_gpus(os.environ)}
    return gpus[index].free_gb if index in gpus else None


# --------------------------------------------------------------------------- phases


def inventory(report: Report) -> int:
    """Phase 1: how many GPUs NVML shows, checked against nvidia-smi."""
    gpus = detect_gpus(os.environ)
    report.figures["gpus"] = [
        {"index": g.index, "name": g.name, "total_gb": g.total_gb, "free_gb": g.free_gb} for g in gpus
    ]
    for g in gpus:
        report.note(f"GPU {g.index}: {g.name}, {g.total_gb} GB, {g.free_gb} GB free")
    smi = shutil.which("nvidia-smi")
    if gpus and smi:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
        report.check(len(rows) == len(gpus), f"inventory: NVML shows {len(gpus)} GPU(s), nvidia-smi {len(rows)}")
        for g, row in zip(gpus, rows, strict=False):
            smi_gb = float(row[2]) / 1024 if len(row) > 2 else 0.0  # MiB; harness's GB are GiB
            close = abs(smi_gb - g.total_gb) <= max(0.02 * g.total_gb, 0.5)
            report.check(
                row[1] == g.name and close,
                f"inventory: GPU {g.index} {g.name} {g.total_gb} GB; nvidia-smi: {row[1]} {smi_gb:.2f} GB",
            )
    elif gpus:
        report.note("nvidia-smi is not installed: the inventory is NVML's alone")
    return len(gpus)


def write_project(where: Path, *, gb: float, host: bool, big_gb: float | None) -> tuple[Path, Path]:
    """Phase 2: the throwaway project and its deploy."""
    project = where / "project"
    (project / "services" / "servers").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "device" / "hog.py", project / "services" / "servers" / "hog.py")
    series = f"{sys.version_info.major}.{sys.version_info.minor}"
    exact = ".".join(str(p) for p in sys.version_info[:3])
    (project / "harness.toml").write_text(f'[lock.python]\n"{series}" = "{exact}"\n')
    vram = 0 if host else gb + 0.5
    hogs = {"hog-a": (gb, vram), "hog-b": (gb, vram)}
    if big_gb is not None:
        hogs["hog-big"] = (0.1, big_gb)
    for name, (hold, need) in hogs.items():
        flags = ', "--host"' if host else ""
        (project / "services" / f"{name}.toml").write_text(
            f'kind = "device-check"\nsummary = "Holds {hold} GiB ({"host" if host else "GPU"} memory)"\n'
            f'protocol = "http"\n'
            f'command = ["{{python}}", "-u", "services/servers/hog.py", "--port", "{{port}}", "--gb", "{hold}", '
            f'"--name", "{name}"{flags}]\n'
            f'port = {_free_port()}\nvram_gb = {need}\nload_seconds = 60\nhealth = "/health"\n'
            f'client = {{ url = "{{url}}" }}\n\n[environment]\npython = "{series}"\nrequirements = []\n'
        )
    deploy = where / "deploy.toml"
    gpu = "" if host else "gpu = 0\n"
    text = f'state = "{where / "state"}"\n\n[broker]\ngpu_wait_seconds = 60\n\n'
    text += "".join(f'[services.{n}]\n{gpu}mode = "on_demand"\nswap = "models"\n\n' for n in ("hog-a", "hog-b"))
    if big_gb is not None:
        text += '[services.hog-big]\nmode = "resident"\n'
    deploy.write_text(text)
    return project, deploy


def lock_and_realize(report: Report, project: Path, home: Path, deploy: Path) -> bool:
    """Phase 3: lock offline, realize into the empty home."""
    t0 = time.monotonic()
    locked = _harness(project, home, deploy, "lock", "--offline")
    if not report.check(locked.returncode == 0, f"lock --offline ({time.monotonic() - t0:.1f} s)"):
        report.note((locked.stderr or locked.stdout)[-1500:])
        return False
    t0 = time.monotonic()
    realized = _harness(project, home, deploy, "realize")
    report.figures["realize_s"] = round(time.monotonic() - t0, 2)
    if not report.check(realized.returncode == 0, f"realize into an empty home ({report.figures['realize_s']} s)"):
        report.note((realized.stderr or realized.stdout)[-1500:])
        return False
    return True


def placement(report: Report, project: Path, home: Path, deploy: Path, *, host: bool, big: bool) -> None:
    """Phase 4: the plan against this machine's live free memory."""
    planned = _harness(project, home, deploy, "plan", "--json")
    if not report.check(planned.returncode == 0, "plan --json"):
        report.note(planned.stderr[-1500:])
        return
    services = {s["name"]: s for s in json.loads(planned.stdout)["services"]}
    for name in ("hog-a", "hog-b"):
        s = services[name]
        where = "on the CPU" if host else "on GPU 0"
        report.check(
            s["mode"] == "on_demand" and s["gpu"] == (None if host else 0) and s["swap"] is not None,
            f"plan: {name} {where}, on demand, swap group {s['swap']} ({s['reason']})",
        )
    if big:
        s = services["hog-big"]
        report.check(
            s["mode"] == "off" and "free" in s["reason"], f"plan: hog-big ({s['vram_gb']} GB) is off: {s['reason']}"
        )


def _row(client: Client, name: str) -> dict[str, object]:
    return next(r for r in client.status()["services"] if r["name"] == name)


def broker(report: Report, project: Path, home: Path, deploy: Path, *, gb: float, host: bool) -> None:
    """Phases 5 and 6: a start, a swap and the end, through the broker of `harness up`."""
    state = deploy.parent / "state"
    up = _harness(project, home, deploy, "up")
    if not report.check(up.returncode == 0, "up: the broker"):
        report.note((up.stderr or up.stdout)[-1500:])
        return
    before = None if host else _free_gb(0)
    pids: list[int] = []
    try:
        client = Client(state_dir=state)
        t0 = time.monotonic()
        lease = client.acquire("hog-a", timeout=120)
        start_a = time.monotonic() - t0
        client.release(lease)
        row = _row(client, "hog-a")
        pids.append(int(row["pid"]))  # type: ignore[call-overload]
        report.figures["start_a_s"] = round(start_a, 3)
        report.check(row["state"] == "ready", f"acquire hog-a: started and ready in {start_a:.2f} s")
        if not host:
            held = row.get("gpu_memory_bytes")
            report.check(
                isinstance(held, int) and held >= gb * _GIB, f"status: hog-a holds {held} bytes of GPU memory (by pid)"
            )
            after = _free_gb(0)
            if before is not None and after is not None:
                drop = before - after
                report.figures["free_drop_gb"] = round(drop, 2)
                report.check(
                    drop >= gb * _GIB / 1e9 * 0.9, f"NVML: GPU 0 free {before} → {after} GB ({drop:.2f} GB held)"
                )
        t0 = time.monotonic()
        lease = client.acquire("hog-b", timeout=180)
        swap = time.monotonic() - t0
        client.release(lease)
        a, b = _row(client, "hog-a"), _row(client, "hog-b")
        pids.append(int(b["pid"]))  # type: ignore[call-overload]
        report.figures["swap_s"] = round(swap, 3)
        report.check(
            a["state"] == "stopped" and b["state"] == "ready",
            f"acquire hog-b: a swap in {swap:.2f} s (hog-a {a['state']}, hog-b {b['state']}; hog-a alone started in {start_a:.2f} s)",
        )
        if not host:
            usage = gpu_memory_by_pid() or {}
            report.check(pids[0] not in usage, "NVML: hog-a's process holds no GPU memory after the swap")
    finally:
        down = _harness(project, home, deploy, "down")
        report.check(down.returncode == 0, "down")
    gone = [pid for pid in pids if not _alive(pid)]
    report.check(len(gone) == len(pids), f"down: every hog process gone ({len(gone)}/{len(pids)})")
    if before is not None:
        deadline = time.monotonic() + 20
        while (end := _free_gb(0)) is not None and end < before - 0.5 and time.monotonic() < deadline:
            time.sleep(0.5)
        report.check(
            end is not None and end >= before - 0.5, f"NVML: GPU 0 free memory back to {end} GB (was {before} GB)"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GiB each hog holds (default 2; --host: 0.05)")
    parser.add_argument("--host", action="store_true", help="no GPU: hold host memory, skip the GPU figures")
    parser.add_argument("--out", type=Path, help="write device-check.json into this folder")
    args = parser.parse_args()
    report = Report()
    print("== 1. inventory", flush=True)
    count = inventory(report)
    if count == 0 and not args.host:
        report.note("no NVIDIA GPU here (NVML found none): nothing to check; --host runs the flow without one")
        _write(args.out, report)
        return 0
    gb = 0.05 if args.host and "--gb" not in sys.argv else args.gb
    big = None if args.host else round((_free_gb(0) or 0) + 1, 1)
    with tempfile.TemporaryDirectory(prefix="harness-device-check-") as scratch:
        where = Path(scratch)
        print("== 2. project", flush=True)
        project, deploy = write_project(where, gb=gb, host=args.host, big_gb=big)
        report.note(f"hog-a, hog-b hold {gb} GiB each{'' if big is None else f'; hog-big asks {big} GB'}")
        home = where / "home"
        print("== 3. lock and realize", flush=True)
        if lock_and_realize(report, project, home, deploy):
            print("== 4. placement", flush=True)
            placement(report, project, home, deploy, host=args.host, big=big is not None)
            print("== 5-6. broker: start, swap, down", flush=True)
            broker(report, project, home, deploy, gb=gb, host=args.host)
    _write(args.out, report)
    print(f"device check: {'FAILED' if report.failed else 'ok'}", flush=True)
    return 1 if report.failed else 0


def _write(out: Path | None, report: Report) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "device-check.json").write_text(json.dumps({"lines": report.lines, "figures": report.figures}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
