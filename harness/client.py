"""The broker's client: ask before each call to a model service, release after it.

Standard library only, and it imports nothing else from harness, so a service's or an
agent's code can use it from any environment (import it, or copy this one file)::

    from harness.client import Client

    client = Client()                      # HARNESS_BROKER, else the state folder's broker.json
    with client.use("kinematics") as lease:
        answer = post(lease.url + "/fk", ...)   # the service is up and yours for this call
        if lease.fresh: ...                # this process has not served this client before
        lease.client                       # the manifest's client table, templates filled

``Lease.client`` is what the service's manifest says its clients are given (its ``client``
table), filled as the service's command is at launch, e.g. for
``client = { url = "{url}", robot = "{weights}/arm7/arm7.json" }``::

    {"robot": "/…/store/…-kinematics-weights/arm7/arm7.json", "url": "http://127.0.0.1:8830"}

An external service's table may use ``{url}`` alone. It is ``{}`` when the manifest has
none, and from a broker too old to send it.

The broker may start the service first (on demand), wait while a swap-group peer finishes
a call, or restart it after a crash; :meth:`Client.acquire` returns once the service is
healthy. A lease must be released (the context manager does it); a client process that
exits holding one has it released by the broker.

Address: the ``address`` argument, else ``$HARNESS_BROKER`` (a URL), else
``<state_dir>/broker.json`` with ``state_dir`` from the argument or ``$HARNESS_STATE``.
Token (the broker answers only its owner): the ``token`` argument, else
``$HARNESS_BROKER_TOKEN``, else ``<state_dir>/broker.token`` (readable by its owner only).
The state folder's two files are read only when they are this user's own regular files.
``harness`` sets ``HARNESS_BROKER`` and ``HARNESS_BROKER_TOKEN`` for every service and
agent it starts.

A broker started again at the same address (a cluster node's, when the task of the shard that
started it was cancelled: ``harness/runs/nodebroker.py``): with ``reconnect`` seconds
(default ``$HARNESS_BROKER_WAIT``, which a cluster shard sets for its command), an acquire
that finds no broker answering (or one refusing the token it was granted leases with: the
new broker, before the run joined it again) tries again for that long rather than fail
(nothing was granted: trying again is safe), and the release of a lease that went with its broker is
not an error.

Errors: :class:`BrokerError` with ``status`` (HTTP), ``code`` and ``log_tail``; subclasses
:class:`ServiceOff` (409: the plan turned the service off), :class:`ServiceFailed` (503: it
failed to start or keeps crashing; ``log_tail`` says why), :class:`NotAuthorized` (401/403:
no or a wrong token), :class:`LeaseExpired` (410: the broker reclaimed a lease held past
its limit) and :class:`BrokerUnavailable` (no broker answers).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # inside harness, errors print as user errors in the CLI; elsewhere plain exceptions
    from harness.errors import HarnessError as _Base
except ImportError:  # pragma: no cover - a copied client outside the harness package
    _Base = Exception  # type: ignore[misc,assignment]


class BrokerError(_Base):
    """The broker refused a request; ``status`` is its HTTP status, ``code`` its reason."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", log_tail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.log_tail = log_tail

    def __str__(self) -> str:
        if self.log_tail and self.log_tail.strip() and self.log_tail.strip() not in self.message:
            return f"{self.message}\n--- last lines of the log ---\n{self.log_tail.rstrip()}"
        return self.message


class ServiceOff(BrokerError):
    """The service is ``off`` in this run's plan (HTTP 409)."""


class ServiceFailed(BrokerError):
    """The service failed to start, or keeps crashing (HTTP 503); see ``log_tail``."""


class BrokerUnavailable(BrokerError):
    """No broker could be found or reached."""


class NotAuthorized(BrokerError):
    """The broker refused the request: no token, a wrong one, or not from its owner (401/403)."""


class LeaseExpired(BrokerError):
    """The lease was held longer than the broker's limit and reclaimed (HTTP 410)."""


@dataclass(frozen=True)
class Lease:
    """Permission to call ``service`` at ``url`` until released.

    ``fresh``: the service process behind ``url`` has not served this client before (its
    first lease after each start, so a scoped policy's memory is known to be empty).
    ``incarnation``: how many times the broker has started it (0: external or foreign).
    ``client``: the manifest's ``client`` table with its templates filled (empty when it
    has none, or the broker predates it).
    """

    id: str
    service: str
    url: str
    fresh: bool
    incarnation: int = 0
    scoped: bool = False
    foreign: bool = False
    client: dict[str, str] = field(default_factory=dict, hash=False)


def _env_seconds(name: str) -> float | None:
    """A number of seconds from the environment variable ``name``; None when unset or not one."""
    try:
        value = float(os.environ.get(name) or "")
    except ValueError:
        return None
    return value if value > 0 else None


def _find_token(token: str | None, state_dir: str | os.PathLike[str] | None) -> str | None:
    if token:
        return token
    from_env = os.environ.get("HARNESS_BROKER_TOKEN")
    if from_env:
        return from_env.strip()
    folder = state_dir or os.environ.get("HARNESS_STATE")
    if folder:
        try:
            return _own_text(Path(folder).expanduser() / "broker.token").strip() or None
        except (OSError, UnicodeDecodeError):
            return None
    return None


def _own_text(path: Path, limit: int = 64 * 1024) -> str:
    """The text of ``path`` when it is a regular file of this user's, else OSError: in a
    shared home another member can make a project's state folder before its owner first
    uses it and plant a ``broker.json`` naming a broker of theirs (which would then get this
    user's requests, and a token of this user's with them)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise PermissionError(f"{path}: not this user's file")
        return os.read(fd, limit).decode()
    finally:
        os.close(fd)


def _find_address(address: str | None, state_dir: str | os.PathLike[str] | None) -> str:
    if address:
        return address.rstrip("/")
    from_env = os.environ.get("HARNESS_BROKER")
    if from_env:
        return from_env.rstrip("/")
    folder = state_dir or os.environ.get("HARNESS_STATE")
    if folder:
        path = Path(folder).expanduser() / "broker.json"
        try:
            return str(json.loads(_own_text(path))["url"]).rstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            raise BrokerUnavailable(
                f"no broker: {path} is missing, unreadable or not yours (is `harness up` running?)"
            ) from None
    raise BrokerUnavailable(
        "no broker address: pass Client(address=...), set HARNESS_BROKER, or set HARNESS_STATE "
        "to the deploy's state folder"
    )


class Client:
    """A connection to the broker, safe to share between threads.

    ``client_id`` names this caller for ``fresh`` (default: a new id per Client, so one
    agent process that makes one Client sees a scoped service's reset). ``timeout``:
    seconds to wait for a service (None: as long as it takes to load and to be free).
    Each thread keeps one keep-alive connection, so an acquire costs no TCP handshake.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        client_id: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        token: str | None = None,
        reconnect: float | None = None,
    ) -> None:
        self.address = _find_address(address, state_dir)
        self.reconnect = reconnect if reconnect is not None else _env_seconds("HARNESS_BROKER_WAIT")
        self._answered = False  # an acquire was granted with this token
        self._token = _find_token(token, state_dir)
        parts = urllib.parse.urlsplit(self.address)
        if parts.scheme != "http" or not parts.hostname:
            raise BrokerUnavailable(f"broker address must be http://host:port, got {self.address!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self.client_id = client_id or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self._local = threading.local()

    # ------------------------------------------------------------------------- HTTP

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        # No socket timeout: an acquire legitimately waits for a model to load.
        conn = http.client.HTTPConnection(self._host, self._port)
        self._local.conn = conn
        return conn, False

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (0, 1):
            conn, reused = self._connection()
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                conn.close()
                self._local.conn = None
                # A kept-alive connection the broker closed while idle: the request never
                # arrived, so sending it again on a new connection is safe (once).
                if not reused or attempt:
                    raise BrokerUnavailable(f"broker at {self.address} closed the connection: {exc}") from None
            except OSError as exc:
                conn.close()
                self._local.conn = None
                raise BrokerUnavailable(f"cannot reach the broker at {self.address}: {exc}") from None
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise BrokerError(f"broker answered {response.status} with non-JSON", status=response.status) from None
        if response.status >= 400:
            message = data.get("error", f"HTTP {response.status}") if isinstance(data, dict) else str(data)
            kind = {401: NotAuthorized, 403: NotAuthorized, 409: ServiceOff, 410: LeaseExpired, 503: ServiceFailed}.get(
                response.status, BrokerError
            )
            if response.status == 401 and not self._token:
                message += " (this client found no token: pass token=, or set HARNESS_BROKER_TOKEN or HARNESS_STATE)"
            if isinstance(data, dict) and data.get("code") == "closing":
                kind = BrokerUnavailable
            raise kind(
                message,
                status=response.status,
                code=data.get("code", "") if isinstance(data, dict) else "",
                log_tail=data.get("log_tail", "") if isinstance(data, dict) else "",
            )
        return data

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------------------ leases

    def acquire(self, service: str, *, timeout: float | None = None) -> Lease:
        """Block until ``service`` is healthy and free for a call; return the lease."""
        body: dict[str, Any] = {"service": service, "client": self.client_id, "pid": os.getpid()}
        wait = self.timeout if timeout is None else timeout
        if wait is not None:
            body["timeout"] = wait
        deadline = time.monotonic() + (self.reconnect or 0.0)
        while True:
            try:
                data = self._request("POST", "/acquire", body)
                break
            except (BrokerUnavailable, NotAuthorized) as exc:
                # None answers (or it is closing): another may come. One refusing a token that
                # was good here: a broker started again that the run has not joined again yet.
                waiting = isinstance(exc, BrokerUnavailable) or self._answered
                if not waiting or time.monotonic() >= deadline:
                    raise
                self.close()  # a kept-alive connection would reach the closing one again
                time.sleep(0.25)
        self._answered = True
        return Lease(
            id=data["lease"],
            service=data["service"],
            url=data["url"],
            fresh=bool(data["fresh"]),
            incarnation=int(data.get("incarnation", 0)),
            scoped=bool(data.get("scoped", False)),
            foreign=bool(data.get("foreign", False)),
            client={str(k): str(v) for k, v in (data.get("client") or {}).items()},
        )

    def release(self, lease: Lease | str) -> None:
        """End a lease (a :class:`Lease` or its id). With ``reconnect``, a lease whose broker
        went away (none answers, or the one there now never granted it) is gone with it."""
        try:
            self._request("POST", "/release", {"lease": lease.id if isinstance(lease, Lease) else lease})
        except BrokerError as exc:
            gone = isinstance(exc, BrokerUnavailable) or exc.code == "unknown_lease"
            if not (self.reconnect and gone):
                raise

    @contextmanager
    def use(self, service: str, *, timeout: float | None = None) -> Iterator[Lease]:
        """``with client.use(name) as lease:`` — acquire, yield, always release."""
        lease = self.acquire(service, timeout=timeout)
        try:
            yield lease
        finally:
            self.release(lease)

    def status(self) -> dict[str, Any]:
        """The broker's ``GET /status``."""
        return self._request("GET", "/status")

    def shutdown(self) -> None:
        """Ask the broker to stop its services and exit."""
        self._request("POST", "/shutdown", {})
