"""A host name looked up once per process, however many threads connect to it at once.

``http.client`` resolves the host on every new connection, and urllib makes a connection per
request. A realize reads dozens of index pages and downloads dozens of files over 8 threads at
once, so 8 lookups of one name went out together, and on a resolver that loses some of a burst
each lost query costs the resolver's timeout (glibc's default: 5 s). Measured on the sam3 set:
the first 8 index pages each took 5.0 s, all of it in ``getaddrinfo``, while uv, which keeps
its connections, waited once at most.

:func:`connect` is what :class:`http.client.HTTPConnection` calls to open its socket
(``_create_connection``): it takes the addresses from :func:`addresses` and tries each in
turn, as :func:`socket.create_connection` does. TLS still verifies the host's name (the
connection keeps it); only the lookup is shared. :func:`addresses` keeps an answer for
:data:`TTL_S` seconds; threads that ask while one lookup is under way wait for it, and a
lookup that fails is the error of every thread that waited for it (each asks again later).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

#: How long one answer is used (seconds): a realize's reads and downloads, not a service's life.
TTL_S = 60.0

_AddrInfo = list[tuple[Any, Any, int, str, Any]]

_lock = threading.Lock()
#: (host, port) → (when, the answer or the error of the last lookup).
_answers: dict[tuple[str, int], tuple[float, _AddrInfo | OSError]] = {}
_lookups: dict[tuple[str, int], threading.Lock] = {}


def addresses(host: str, port: int) -> _AddrInfo:
    """``socket.getaddrinfo(host, port, type=SOCK_STREAM)``, asked once per :data:`TTL_S`
    however many threads want it at once."""
    key = (host, port)
    asked = time.monotonic()
    with _lock:
        lookup = _lookups.setdefault(key, threading.Lock())
    with lookup:  # one lookup of a name at a time; the others wait for its answer
        with _lock:
            held = _answers.get(key)
        if held is not None:
            when, answer = held
            if isinstance(answer, OSError):
                if when >= asked:  # failed while this thread waited for it
                    raise type(answer)(*answer.args)
            elif time.monotonic() - when < TTL_S:
                return answer
        try:
            found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except OSError as exc:
            with _lock:
                _answers[key] = (time.monotonic(), exc)
            raise
        with _lock:
            _answers[key] = (time.monotonic(), found)
        return found


def connect(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
    """:func:`socket.create_connection` on :func:`addresses`: each address in turn, the last
    error raised when none answers. ``timeout`` as ``http.client`` passes it (a number, None,
    or its default marker, which leaves the socket's default)."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in addresses(host, port):
        sock = None
        try:
            sock = socket.socket(family, kind, proto)
            if timeout is None or isinstance(timeout, (int, float)):
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            if sock is not None:
                sock.close()
    raise error if error is not None else OSError(f"no address found for {host}")


def forget() -> None:
    """Drop every answer held (a test, or a long-lived process after the network changed)."""
    with _lock:
        _answers.clear()


__all__ = ["TTL_S", "addresses", "connect", "forget"]
