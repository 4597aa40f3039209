"""A benchmark whose simulator runs elsewhere: what a run records of it.

A benchmark manifest with ``simulator = "external"`` (a task from The Simulator) puts only
its client in the closure; the simulator is a service at the address the deploy gives
(``[benchmarks.<name>] url``), built, versioned and run by someone else. Like an external
service, it is an impurity of every run that uses it: the record names its address and,
when the manifest names an ``identity`` path, what the simulator says it is (its version,
its task), asked once before the worker starts. ``audit --strict`` fails on it, and ``diff``
names a change of address or of anything it reported.

Asking the identity is the one connection harness itself opens to a machine other than
this one during a run (DESIGN invariant 6: the address is the deploy's, never an index's
or a hub's); the worker, the simulator's client, talks to it all the run long.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError, InputError

if TYPE_CHECKING:
    from harness.runtime.plan import RemoteSimulator

#: The largest identity answer read: a version and a task name, not a payload.
MAX_IDENTITY_BYTES = 64 * 1024
#: How long a run waits for the identity answer before it refuses to start.
IDENTITY_TIMEOUT_S = 10.0


def simulator_entry(simulator: RemoteSimulator | None, *, timeout: float = IDENTITY_TIMEOUT_S) -> dict[str, Any] | None:
    """What the run's ``config.json`` records of its remote simulator (None: the benchmark's
    simulator runs here, or there is none): the benchmark, the address, the identity path
    and the simulator's answer there (None when the manifest names no identity path).

    Refuses (:class:`InputError`) a simulator no deploy gives an address for, and
    (:class:`HarnessError`) one whose identity path does not answer with a JSON object: its
    client would have nothing to talk to, and the run nothing honest to record."""
    if simulator is None:
        return None
    name = simulator.benchmark
    if simulator.url is None:
        raise InputError(
            f'benchmark {name}: its simulator runs elsewhere (simulator = "external"), and no deploy says where',
            hint=f'give its address in the deploy: [benchmarks.{name}] url = "http://host:port" (--deploy PATH)',
        )
    reported = ask_identity(simulator.url, simulator.identity, name, timeout=timeout) if simulator.identity else None
    return {"benchmark": name, "url": simulator.url, "identity": simulator.identity, "reported": reported}


def ask_identity(url: str, path: str, benchmark: str, *, timeout: float = IDENTITY_TIMEOUT_S) -> dict[str, Any]:
    """GET ``url + path``: the JSON object the simulator answers there, or a
    :class:`HarnessError` naming the address and what went wrong."""
    import urllib.error
    import urllib.request

    address = url.rstrip("/") + path
    if address.startswith("ws"):  # a WebSocket simulator answers plain HTTP GETs on the same port
        address = "http" + address[2:]
    where = f"benchmark {benchmark}: its simulator at {url} did not answer GET {path}"
    hint = "is it running, and is the deploy's [benchmarks." + benchmark + "] url its address? the run was not started"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as response:
            body = response.read(MAX_IDENTITY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise HarnessError(f"{where}: HTTP {exc.code} {exc.reason}", hint=hint) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise HarnessError(f"{where}: {reason}", hint=hint) from None
    if len(body) > MAX_IDENTITY_BYTES:
        raise HarnessError(f"{where} with a JSON object: the answer is over {MAX_IDENTITY_BYTES} bytes", hint=hint)
    try:
        data = json.loads(body)
    except ValueError:
        raise HarnessError(f"{where} with JSON: {body[:80]!r}", hint=hint) from None
    if not isinstance(data, dict):
        raise HarnessError(f"{where} with a JSON object (it answered a {type(data).__name__})", hint=hint)
    return data


def simulator_impurity(entry: dict[str, Any]) -> str:
    """The impurity line a run records for its remote simulator."""
    reported = entry.get("reported")
    says = (
        f"; it reports {json.dumps(reported, sort_keys=True)}"
        if isinstance(reported, dict)
        else "; its manifest names no identity path, so nothing it is was recorded"
    )
    return (
        f"{entry['benchmark']}: simulator at {entry['url']} runs elsewhere (not built by harness: only its client "
        f"is in the closure{says})"
    )


def simulator_differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """What differs between two runs' remote simulators (``config.json``'s ``simulator``),
    pure: the address, and each key the simulator reported (its version, its task)."""
    if not a and not b:
        return []
    if not a or not b:
        return [f"simulator: {_where(a)} → {_where(b)}"]
    lines: list[str] = []
    label = f"simulator of {b.get('benchmark')}"
    if a.get("url") != b.get("url"):
        lines.append(f"{label}: address {a.get('url')} → {b.get('url')}")
    ra, rb = a.get("reported"), b.get("reported")
    if isinstance(ra, dict) and isinstance(rb, dict):
        for key in sorted(set(ra) | set(rb)):
            if ra.get(key) != rb.get(key):
                lines.append(f"{label}: reports {key}: {_value(ra, key)} → {_value(rb, key)}")
    elif ra != rb:
        lines.append(f"{label}: reported {_value({'_': ra}, '_')} → {_value({'_': rb}, '_')}")
    return lines


def _where(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "here (or none)"
    return f"{entry.get('benchmark')} elsewhere, at {entry.get('url')}"


def _value(data: dict[str, Any], key: str) -> str:
    if key not in data or data[key] is None:
        return "(nothing)"
    value = data[key]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
