"""The broker's web UI (``/ui``): reachable only through a one-time login URL or the owner's
token, never from another web page; its buttons start and stop real services; its log and
event views read the real broker. A real broker with real fake-model processes throughout,
and headless Chromium rendering the page where it is installed."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from harness.runtime.broker import Broker, ui_login_url
from harness.runtime.plan import Plan
from harness.runtime.scheduling import BrokerError
from harness.runtime.webui import UiSessions, cookie_name, read_log
from tests.test_broker import (
    OTHER_USER,
    fake,
    fake_processes,
    make_broker,
    other_user,
    placement,
    service_status,
    wait_until,
)

__all__ = ["make_broker"]  # the fixture, shared with tests/test_broker.py


def request(
    address: str, method: str, path: str, *, headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    """One request as given; status, headers (lower-case names) and body."""
    host, port = address.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = dict(headers or {})
        data = None if body is None else json.dumps(body).encode()
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        if data is not None:
            headers.setdefault("Content-Type", "application/json")
            headers["Content-Length"] = str(len(data))
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders(data)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def login(address: str, token: str) -> str:
    """The Cookie header of a new UI session: a one-time code asked with the token, then used."""
    status, _, body = request(address, "POST", "/ui-login", headers={"Authorization": f"Bearer {token}"}, body={})
    assert status == 200, body
    url = json.loads(body)["url"]
    assert url.startswith(address + "/ui/login?code=")
    status, headers, _ = request(address, "GET", url.removeprefix(address))
    assert status == 303 and headers["location"] == "/ui", headers
    cookie = headers["set-cookie"]
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/ui"):
        assert flag in cookie, cookie
    return cookie.split(";", 1)[0]


def test_one_time_codes_and_sessions_expire() -> None:
    now = [1000.0]
    sessions = UiSessions(clock=lambda: now[0], code_seconds=60, session_seconds=600)
    code = sessions.new_code()
    session = sessions.redeem(code)
    assert session is not None and sessions.valid(session)
    assert sessions.redeem(code) is None  # used once
    late = sessions.new_code()
    now[0] += 61
    assert sessions.redeem(late) is None  # expired before use
    assert sessions.valid(session)
    now[0] += 600
    assert not sessions.valid(session)
    assert sessions.redeem("guessed") is None and not sessions.valid("guessed")
    assert sessions.csrf(session) != sessions.csrf("another") and re.fullmatch(r"[0-9a-f]{64}", sessions.csrf(session))


def test_the_ui_answers_only_its_owner_and_never_another_page(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-ui", tmp_path)
    broker, client = make_broker([placement(spec)], [spec])
    address, port = client.address, client.address.rsplit(":", 1)[1]
    assert (tmp_path / "broker.token").stat().st_mode & 0o777 == 0o600
    # Without a login: nothing of the UI, and no login code without the token.
    for path in ("/ui", "/ui/app.js", "/ui/api/status", "/ui/api/events", "/ui/api/logs?name=x", "/ui/api/runs"):
        assert request(address, "GET", path)[0] == 401, path
    assert request(address, "POST", "/ui-login", body={})[0] == 401
    assert request(address, "GET", "/ui/login?code=guessed")[0] == 403
    assert request(address, "GET", "/ui/login")[0] == 403
    # The owner's token reads the UI as a script would; the one-time URL logs a browser in, once.
    assert request(address, "GET", "/ui/api/status", headers={"Authorization": f"Bearer {broker.token}"})[0] == 200
    url = ui_login_url(tmp_path)
    path = url.removeprefix(address)
    status, headers, _ = request(address, "GET", path)
    assert status == 303 and cookie_name(int(port)) in headers["set-cookie"]
    assert request(address, "GET", path)[0] == 403  # used up
    cookie = headers["set-cookie"].split(";", 1)[0]
    status, headers, page = request(address, "GET", "/ui", headers={"Cookie": cookie})
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]
    csrf = re.search(rb'name="harness-csrf" content="([0-9a-f]{64})"', page)
    assert csrf is not None, page[:400]
    status, headers, script = request(address, "GET", "/ui/app.js", headers={"Cookie": cookie})
    assert status == 200 and b"EventSource" in script and headers["content-type"].startswith("text/javascript")
    answer = json.loads(request(address, "GET", "/ui/api/status", headers={"Cookie": cookie})[2])
    assert [s["name"] for s in answer["services"]] == [spec.name]
    # The cookie opens /ui only: the broker's own API still wants the token.
    assert request(address, "GET", "/status", headers={"Cookie": cookie})[0] == 401
    # Another page (Origin, Sec-Fetch-Site) or a rebound name (Host) is refused even with the cookie.
    refused = [
        {"Cookie": cookie, "Origin": "http://evil.example"},
        {"Cookie": cookie, "Sec-Fetch-Site": "cross-site"},
        {"Cookie": cookie, "Host": f"evil.example:{port}"},
        {"Cookie": cookie.replace("=", "=x", 1)},
        {"Cookie": f"harness_ui_1={cookie.split('=', 1)[1]}"},  # another broker's cookie name
    ]
    for headers in refused:
        assert request(address, "GET", "/ui/api/status", headers=headers)[0] in (401, 403), headers
    # A POST needs the page's own Origin and its CSRF token; none of these starts anything.
    own = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}", "X-Harness-CSRF": csrf.group(1).decode()}
    forged = [
        {**own, "Origin": "http://evil.example"},
        {k: v for k, v in own.items() if k != "Origin"},
        {k: v for k, v in own.items() if k != "X-Harness-CSRF"},
        {**own, "X-Harness-CSRF": "0" * 64},
        {**own, "Sec-Fetch-Site": "same-site"},
        {k: v for k, v in own.items() if k != "Cookie"},
    ]
    for headers in forged:
        status, _, body = request(address, "POST", "/ui/api/start", headers=headers, body={"name": spec.name})
        assert status in (401, 403), (headers, body)
    assert service_status(broker, spec.name)["starts"] == 0 and fake_processes({spec.name}) == {}
    status, _, body = request(address, "POST", "/ui/api/start", headers=own, body={"name": spec.name})
    assert status == 200 and json.loads(body)["results"] == {"start": None}, body
    assert service_status(broker, spec.name)["state"] == "ready" and len(fake_processes({spec.name})[spec.name]) == 1
    assert request(address, "POST", "/ui/api/start", headers=own, body={"name": "nope"})[0] == 404
    assert request(address, "POST", "/ui/api/start", headers=own, body={"name": "../x"})[0] == 400
    assert request(address, "POST", "/ui/api/shutdown", headers=own, body={})[0] == 404


def test_the_ui_restarts_and_stops_a_service_and_shows_its_log_and_events(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-svc", tmp_path)
    broker, client = make_broker([placement(spec, mode="resident")], [spec])
    assert broker.start() == {spec.name: None}
    cookie = login(client.address, broker.token)
    csrf = re.search(
        r'content="([0-9a-f]{64})"', request(client.address, "GET", "/ui", headers={"Cookie": cookie})[2].decode()
    )
    assert csrf is not None
    port = client.address.rsplit(":", 1)[1]
    own = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}", "X-Harness-CSRF": csrf.group(1)}
    first = fake_processes({spec.name})[spec.name]
    # A lease held: the status row names its holder.
    with client.use(spec.name) as _lease:
        row = json.loads(request(client.address, "GET", "/ui/api/status", headers={"Cookie": cookie})[2])["services"][0]
        assert row["leases"] == 1 and row["holders"][0]["client"] == client.client_id, row
    status, _, body = request(client.address, "POST", "/ui/api/restart", headers=own, body={"name": spec.name})
    assert status == 200 and json.loads(body)["results"] == {"stop": "stopped", "start": None}, body
    second = fake_processes({spec.name})[spec.name]
    assert second != first and service_status(broker, spec.name)["incarnation"] == 2
    status, _, body = request(client.address, "POST", "/ui/api/stop", headers=own, body={"name": spec.name})
    assert status == 200 and json.loads(body)["results"] == {"stop": "stopped"}
    wait_until(lambda: fake_processes({spec.name}) == {}, what="the service's process gone")
    # The log: its last lines, then only what was written after the offset.
    status, _, body = request(client.address, "GET", f"/ui/api/logs?name={spec.name}", headers={"Cookie": cookie})
    log = json.loads(body)
    assert status == 200 and log["text"].count("loading for") == 2, log
    with open(tmp_path / "logs" / f"{spec.name}.log", "a") as handle:
        handle.write("a line written later\n")
    later = json.loads(
        request(
            client.address, "GET", f"/ui/api/logs?name={spec.name}&offset={log['offset']}", headers={"Cookie": cookie}
        )[2]
    )
    assert later["text"] == "a line written later\n" and later["offset"] > log["offset"]
    bad = request(client.address, "GET", "/ui/api/logs?name=../../etc/passwd", headers={"Cookie": cookie})
    assert bad[0] == 400
    # The events, as the page's EventSource reads them.
    host, port_number = client.address.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port_number), timeout=30)
    try:
        conn.request("GET", "/ui/api/events?since=0", headers={"Cookie": cookie})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
        kinds: list[str] = []
        while "stopped" not in kinds:
            line = response.readline().decode()
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: ").strip())
    finally:
        conn.close()
    assert kinds[:4] == ["added", "start", "ready", "lease"] and "stop" in kinds, kinds


def test_the_log_view_starts_again_when_the_log_is_rotated(tmp_path: Path) -> None:
    """A log moved aside to ``NAME.log.1`` and begun again (rotation at its writer's start)
    is followed from the new file's start, even once the new file has grown past the old
    offset: the reader compares files, not only sizes."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "sam3.log"
    log.write_text("old line\n" * 3)
    first = read_log(tmp_path, {"name": ["sam3"]})
    assert first["text"] == "old line\n" * 3 and first["offset"] == log.stat().st_size
    log.rename(logs / "sam3.log.1")
    log.write_text("new line\n" * 10)  # longer than the old offset: a size check alone misses it
    again = read_log(tmp_path, {"name": ["sam3"], "offset": [str(first["offset"])], "file": [first["file"]]})
    assert again["reset"] and again["text"] == "new line\n" * 10, again
    with open(log, "a") as handle:
        handle.write("appended\n")
    later = read_log(tmp_path, {"name": ["sam3"], "offset": [str(again["offset"])], "file": [again["file"]]})
    assert not later["reset"] and later["text"] == "appended\n", later
    with pytest.raises(BrokerError):
        read_log(tmp_path, {"name": ["sam3"], "offset": ["0"], "file": ["x1"]})


def test_the_ui_lists_recent_runs_and_serves_their_reports(make_broker, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name, report in (("20261205-090000-000-aaaa", True), ("20261205-100000-000-bbbb", False)):
        (runs / name).mkdir(parents=True)
        (runs / name / "result.json").write_text(json.dumps({"started": 1.0, "exit_status": 0, "score": 0.5}))
        if report:
            (runs / name / "report.html").write_text("<!doctype html><title>report</title><p>the report</p>")
    spec = fake(f"{tmp_path.name}-runs", tmp_path / "state")
    broker, client = make_broker([placement(spec)], [spec], runs_dir=runs)
    cookie = login(client.address, broker.token)
    listed = json.loads(request(client.address, "GET", "/ui/api/runs", headers={"Cookie": cookie})[2])["runs"]
    assert [(r["id"], r["report"], r["score"]) for r in listed] == [
        ("20261205-100000-000-bbbb", False, 0.5),
        ("20261205-090000-000-aaaa", True, 0.5),
    ]
    status, headers, body = request(
        client.address, "GET", "/ui/runs/20261205-090000-000-aaaa/report", headers={"Cookie": cookie}
    )
    assert status == 200 and b"the report" in body and "script-src" not in headers["content-security-policy"]
    status, _, body = request(
        client.address, "GET", "/ui/runs/20261205-100000-000-bbbb/report", headers={"Cookie": cookie}
    )
    assert status == 404 and b"harness report 20261205-100000-000-bbbb" in body
    for bad in ("/ui/runs/..%2F..%2Fetc/report", "/ui/runs/.hidden/report"):
        assert request(client.address, "GET", bad, headers={"Cookie": cookie})[0] == 404
    assert request(client.address, "GET", "/ui/runs/20261205-090000-000-aaaa/report")[0] == 401


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """Headless Chromium driven through the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages ended by NUL on fds 3 and 4), the standard library alone."""

    def __init__(self, url: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="harness-chromium-")
        to_child, self._send = os.pipe()
        self._receive, from_child = os.pipe()

        def fds() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        # No sandbox: it loads only the test's own page, and containers often lack the namespaces it needs.
        self.proc = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=fds,
            start_new_session=True,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        try:
            targets = self.call("Target.getTargets")["targetInfos"]
        except AssertionError:
            self.close()
            pytest.skip("Chromium did not start here")
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._send, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                ready, _, _ = select.select([self._receive], [], [], 60)
                assert ready, f"Chromium did not answer {method} within 60 s"
                chunk = os.read(self._receive, 1 << 16)
                assert chunk, "Chromium closed its DevTools pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                assert "error" not in answer, answer
                return dict(answer["result"])

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        return result["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)  # the browser and its helpers: a session of its own
        self.proc.wait(30)
        os.close(self._send)
        os.close(self._receive)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium")
def test_headless_chromium_shows_the_services_and_its_buttons_work(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-page", tmp_path)
    broker, client = make_broker([placement(spec, mode="resident")], [spec])
    assert broker.start() == {spec.name: None}
    browser = Chromium(ui_login_url(tmp_path))
    try:
        table = "document.querySelector('#services tbody') ? document.querySelector('#services tbody').innerText : ''"
        text = wait_until(
            lambda: spec.name in (browser.evaluate(table) or "") and browser.evaluate(table), 30, "the table"
        )
        assert "resident" in text and "ready" in text, text
        # The log view tails the log chosen (the broker's first; this one has none, being in-process).
        browser.evaluate(f"document.getElementById('log-name').value = {json.dumps(spec.name)}")
        wait_until(
            lambda: "loading for" in (browser.evaluate("document.getElementById('log').textContent") or ""),
            30,
            "the log",
        )
        wait_until(
            lambda: browser.evaluate("document.getElementById('connection').textContent") == "live", 30, "events"
        )
        # The stop button: a same-origin POST with the page's CSRF token, as a user's click sends it.
        browser.evaluate(f"document.querySelector('button[data-action=stop][data-service=\"{spec.name}\"]').click()")
        wait_until(lambda: service_status(broker, spec.name)["state"] == "stopped", 30, "the service stopped")
        shown = "document.getElementById('events').innerText"
        wait_until(lambda: f"stopped {spec.name}" in (browser.evaluate(shown) or ""), 30, "the stop in the events")
        assert fake_processes({spec.name}) == {}
    finally:
        browser.close()


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/sbin/useradd").exists(), reason="creates another user (needs root and useradd)"
)
def test_another_local_user_cannot_log_in_to_the_ui(tmp_path: Path) -> None:
    other_user()
    state = Path(tempfile.mkdtemp(prefix="harness-ui-auth-", dir="/tmp"))
    spec = fake(f"{state.name}-svc", state)
    broker = Broker(Plan((placement(spec),)), {spec.name: spec}, state, tick=0.05, grace=(2.0, 2.0))
    try:
        address = broker.serve_in_thread()
        state.chmod(0o755)  # a folder the other user may look into: the token stays its owner's
        probe = r"""
import sys, urllib.request, urllib.error
state, address = sys.argv[1:3]
try:
    open(state + "/broker.token").read()
    print("read-token")
except PermissionError:
    print("token-unreadable")
for method, path in (("GET", "/ui"), ("GET", "/ui/login?code=guessed"), ("POST", "/ui-login")):
    request = urllib.request.Request(address + path, data=b"{}" if method == "POST" else None, method=method)
    try:
        urllib.request.urlopen(request, timeout=10)
        print(path, 200)
    except urllib.error.HTTPError as exc:
        print(path, exc.code)
"""
        runnable = [
            p
            for p in ("/usr/bin/python3", sys.executable)
            if subprocess.run(["runuser", "-u", OTHER_USER, "--", p, "-c", "pass"], capture_output=True).returncode == 0
        ]
        if not runnable:
            pytest.skip(f"no Python that {OTHER_USER} may run")
        result = subprocess.run(
            ["runuser", "-u", OTHER_USER, "--", runnable[0], "-I", "-c", probe, str(state), address],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[:4] == [
            "token-unreadable",
            "/ui 401",
            "/ui/login?code=guessed 403",
            "/ui-login 401",
        ], result.stdout
    finally:
        broker.shutdown()
        shutil.rmtree(state, ignore_errors=True)


def test_the_ui_is_served_on_loopback_only_and_never_to_a_runs_token(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-lo", tmp_path)
    broker, client = make_broker([placement(spec)], [spec])
    status, _, body = request(
        client.address, "POST", "/runs", headers={"Authorization": f"Bearer {broker.token}"}, body={"run": "r1"}
    )
    run_token = json.loads(body)["token"]
    status, _, body = request(
        client.address, "POST", "/ui-login", headers={"Authorization": f"Bearer {run_token}"}, body={}
    )
    assert status == 403, body
    # A broker bound to an address that is not 127.0.0.1 or ::1 serves its API (with the token) but no UI.
    elsewhere = Broker(Plan((placement(spec),)), {spec.name: spec}, tmp_path / "elsewhere", host="127.0.0.2")
    try:
        address = elsewhere.serve_in_thread()
        auth = {"Authorization": f"Bearer {elsewhere.token}"}
        assert request(address, "GET", "/status", headers=auth)[0] == 200
        status, _, body = request(address, "GET", "/ui", headers=auth)
        assert status == 403 and b"loopback only" in body
        code = json.loads(request(address, "POST", "/ui-login", headers=auth, body={})[2])["url"].split("code=")[1]
        assert request(address, "GET", f"/ui/login?code={code}")[0] == 403
    finally:
        elsewhere.shutdown()
