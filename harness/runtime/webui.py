"""The broker's web UI (``GET /ui``): who may see it, and what its pages and calls answer.

The broker binds loopback only and answers only its owner (``Authorization: Bearer`` with
``<state>/broker.token``, 0600). A browser cannot send that header, so ``harness ui`` asks
the broker (with the token) for a **one-time URL**, ``/ui/login?code=C``: opening it once
sets a cookie (``HttpOnly``, ``SameSite=Strict``, ``Path=/ui``) naming a session, and
redirects to ``/ui``. The code is good for one use within :data:`CODE_SECONDS`; only hashes
of codes and sessions are kept, in the broker's memory (a new broker, a new login).

Everything under ``/ui`` takes the session cookie (or the owner's bearer token); nothing
outside ``/ui`` takes the cookie. Host must be the broker's loopback address (as for every
request: a DNS-rebinding page is refused). A request carrying an ``Origin`` must come from
the broker's own origin; a ``POST`` (start, stop, restart) must also carry that ``Origin``
and the session's CSRF token (``X-Harness-CSRF``, which the page holds), so another web
page can neither read the UI nor press its buttons.

Pages and calls (``/ui/api/...`` answer JSON):

    GET  /ui                       the page (services, live events, logs, recent runs)
    GET  /ui/app.js, /ui/app.css   its script and style (package data, no build step)
    GET  /ui/api/status            the broker's /status
    GET  /ui/api/events?since=N    the broker's /events stream (EventSource)
    GET  /ui/api/logs?name=S[&offset=B&file=F]  a log's last lines (no offset) or what was
                                   appended after byte B of file F: {"name", "offset", "file",
                                   "text", "reset"}
    GET  /ui/api/runs              recent run records (``runs_dir``) and whether each has a report
    GET  /ui/runs/ID/report        a run's ``report.html`` (``harness report ID`` writes it)
    POST /ui/api/start|stop|restart  {"name": S}: one service

This module holds the sessions, the request checks, the assets and the readers; the
broker's handler routes to them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.runtime.logs import last_lines, log_files
from harness.runtime.scheduling import BrokerError

#: How long a one-time URL stays good (seconds), and a session after it.
CODE_SECONDS = 120.0
SESSION_SECONDS = 12 * 3600.0
#: The header a POST from the page carries its CSRF token in.
CSRF_HEADER = "X-Harness-CSRF"
#: The assets the page loads, by their path under /ui/.
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
#: Lines a log view starts with, and the most bytes one follow step hands back.
LOG_LINES = 200
LOG_STEP_BYTES = 1 << 18
#: Recent runs the page lists.
RUNS_LISTED = 20
#: What the page and its assets may load: only themselves (no CDN, no inline script).
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
#: A run report is one self-contained file: inline style only, no script.
REPORT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


@dataclass
class UiSessions:
    """One-time login codes and the sessions they open (hashes only); thread-safe."""

    clock: Callable[[], float] = time.monotonic
    code_seconds: float = CODE_SECONDS
    session_seconds: float = SESSION_SECONDS
    _codes: dict[bytes, float] = field(default_factory=dict)  # sha256(code) -> expiry
    _sessions: dict[bytes, float] = field(default_factory=dict)  # sha256(session) -> expiry
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))  # CSRF tokens are HMACs of sessions
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new_code(self) -> str:
        """A code for one login, good for :attr:`code_seconds`."""
        code = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._codes = {k: t for k, t in self._codes.items() if t > now}
            self._codes[_digest(code)] = now + self.code_seconds
        return code

    def redeem(self, code: str) -> str | None:
        """The new session's secret for ``code`` (which is then used up), or None when the
        code is unknown, used or expired."""
        now = self.clock()
        with self._lock:
            expiry = self._codes.pop(_digest(code), None)
            if expiry is None or expiry <= now:
                return None
            session = secrets.token_urlsafe(32)
            self._sessions = {k: t for k, t in self._sessions.items() if t > now}
            self._sessions[_digest(session)] = now + self.session_seconds
        return session

    def valid(self, session: str) -> bool:
        with self._lock:
            expiry = self._sessions.get(_digest(session))
        return expiry is not None and expiry > self.clock()

    def csrf(self, session: str) -> str:
        """The CSRF token of ``session``: the page holds it, another page cannot learn it."""
        return hmac.new(self._key, session.encode("utf-8", "surrogateescape"), "sha256").hexdigest()


def cookie_name(port: int) -> str:
    """Cookies ignore ports: each broker's cookie is named after its own."""
    return f"harness_ui_{port}"


def session_cookie(port: int, session: str, seconds: float = SESSION_SECONDS) -> str:
    """The ``Set-Cookie`` value of a new session."""
    return f"{cookie_name(port)}={session}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={int(seconds)}"


def cookie_value(header: str | None, port: int) -> str | None:
    """The session named in a ``Cookie`` header for the broker on ``port``, if any."""
    wanted = cookie_name(port)
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == wanted and value:
            return value
    return None


@dataclass(frozen=True)
class UiRequest:
    """What the checks need of one request to ``/ui``."""

    method: str
    host: str | None
    origin: str | None
    fetch_site: str | None  # Sec-Fetch-Site, which browsers send
    cookie: str | None
    authorization: str | None
    csrf: str | None


def check_ui(
    request: UiRequest, *, port: int, allowed_hosts: frozenset[str] | None, token: bytes, sessions: UiSessions
) -> str | None:
    """Raise :class:`BrokerError` (403, 401) unless ``request`` may use the UI. Returns the
    session it came with (None: the owner's bearer token)."""
    if allowed_hosts is not None and request.host not in allowed_hosts:
        raise BrokerError(403, "forbidden", f"Host {request.host!r} is not this broker's loopback address")
    own_origin = f"http://{request.host}"
    if request.origin is not None and request.origin != own_origin:
        raise BrokerError(403, "forbidden", f"requests from another web page (Origin {request.origin!r}) are refused")
    if request.fetch_site not in (None, "same-origin", "none"):
        raise BrokerError(
            403, "forbidden", f"requests from another site (Sec-Fetch-Site {request.fetch_site}) are refused"
        )
    scheme, _, given = (request.authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token):
        return None
    session = cookie_value(request.cookie, port)
    if session is None or not sessions.valid(session):
        raise BrokerError(
            401,
            "unauthorized",
            "the web UI needs a login: run `harness ui` and open the one-time URL it prints",
        )
    if request.method == "POST":
        if request.origin != own_origin:
            raise BrokerError(403, "forbidden", "a POST to the UI must come from the UI's own page (its Origin)")
        if not request.csrf or not hmac.compare_digest(request.csrf, sessions.csrf(session)):
            raise BrokerError(403, "forbidden", f"a POST to the UI must carry the page's {CSRF_HEADER} token")
    return session


# ------------------------------------------------------------------------- assets


def _asset_dir() -> Path:
    return Path(__file__).resolve().parent / "ui"


def asset(name: str) -> tuple[bytes, str]:
    """An asset's bytes and content type; 404 for any other name."""
    if name not in ASSETS:
        raise BrokerError(404, "not_found", f"no such UI file: {name}")
    return (_asset_dir() / name).read_bytes(), ASSETS[name]


def page(csrf: str) -> bytes:
    """The page, with the session's CSRF token in its ``<meta>``."""
    text = (_asset_dir() / "index.html").read_text(encoding="utf-8")
    return text.replace("{{csrf}}", csrf if re.fullmatch(r"[0-9a-f]*", csrf) else "").encode()


def service_name(data: Mapping[str, Any]) -> str:
    """The ``name`` of a UI POST's body; 400 when it is not a service name."""
    name = data.get("name")
    if not isinstance(name, str) or not _SERVICE.fullmatch(name):
        raise BrokerError(400, "bad_request", 'the UI names one service: {"name": service}')
    return name


# ------------------------------------------------------------------------- readers


def read_log(state_dir: Path, query: Mapping[str, list[str]]) -> dict[str, Any]:
    """``/ui/api/logs``: the last :data:`LOG_LINES` lines of a log (no ``offset``), or the
    bytes written after ``offset`` (at most :data:`LOG_STEP_BYTES`, ending at a line's end
    where one is). ``file`` names the file the offset belongs to (its inode); a caller that
    sends it back (``&file=``) is told ``reset`` when the log shrank (truncated) or was
    replaced (rotated to ``NAME.log.1`` and begun again), and ``text`` is then its last
    lines again."""
    name = (query.get("name") or [""])[0]
    if not _SERVICE.fullmatch(name):
        raise BrokerError(400, "bad_request", "logs needs ?name=SERVICE")
    try:
        path = log_files(state_dir, [name])[name]
    except InputError:  # no log of that name (yet)
        return {"name": name, "offset": 0, "text": "", "reset": False}
    offset, file = _number(query, "offset"), _number(query, "file")
    info = path.stat() if path.is_file() else None
    size, inode = (info.st_size, str(info.st_ino)) if info else (0, "0")
    if offset is None or offset > size or (file is not None and str(file) != inode):
        lines = last_lines(path, LOG_LINES)
        return {
            "name": name,
            "offset": size,
            "file": inode,
            "text": "".join(f"{line}\n" for line in lines),
            "reset": offset is not None,
        }
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(min(size - offset, LOG_STEP_BYTES))
    if len(data) == LOG_STEP_BYTES and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    text = data.decode("utf-8", "replace")
    return {"name": name, "offset": offset + len(data), "file": inode, "text": text, "reset": False}


def _number(query: Mapping[str, list[str]], key: str) -> int | None:
    """The query's ``key`` as a non-negative integer (absent: ``None``); 400 otherwise."""
    values = query.get(key)
    if not values:
        return None
    if not re.fullmatch(r"[0-9]{1,20}", values[0]):
        raise BrokerError(400, "bad_request", f"bad {key} {values[0][:40]!r}")
    return int(values[0])


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recent_runs(runs_dir: Path | None, count: int = RUNS_LISTED) -> list[dict[str, Any]]:
    """The newest ``count`` run records under ``runs_dir``: id, start, end, exit status,
    score and whether ``report.html`` is there. Reads two small files per run listed."""
    if runs_dir is None or not runs_dir.is_dir():
        return []
    folders = sorted((p for p in runs_dir.iterdir() if _RUN_ID.fullmatch(p.name) and p.is_dir()), reverse=True)
    rows = []
    for folder in folders[:count]:
        config, result = _json_object(folder / "config.json"), _json_object(folder / "result.json")
        rows.append(
            {
                "id": folder.name,
                "started": result.get("started", config.get("started")),
                "ended": result.get("ended"),
                "exit_status": result.get("exit_status"),
                "score": result.get("score"),
                "report": (folder / "report.html").is_file(),
            }
        )
    return rows


def report_file(runs_dir: Path | None, run_id: str) -> Path:
    """A run's ``report.html``; 404 naming the command that writes it."""
    if runs_dir is None or not _RUN_ID.fullmatch(run_id):
        raise BrokerError(404, "not_found", f"no run {run_id!r} here")
    path = runs_dir / run_id / "report.html"
    if not path.is_file():
        raise BrokerError(404, "not_found", f"run {run_id} has no report yet: harness report {run_id}")
    return path
