"""The one downloader: streaming, resumable, and checked against a lock's size and sha256.

Every byte harness takes from outside for the store — wheels and sdists from an index, weight
files from a hub, a URL or a local path — goes through :func:`download`, so DESIGN invariant 3
("every byte entering the store is checked against a hash the lock recorded before the
download") holds in one place:

* the bytes stream into ``<dest>.part`` and are hashed as they arrive; ``dest`` gets its name
  (an atomic rename) only once size and sha256 equal the lock's, so a ``dest`` that exists
  is always right, and a wrong file never appears under it;
* a ``.part`` left by an interrupted run is resumed with an HTTP ``Range`` request from its
  end; a server that ignores the range (``200``) or refuses it (``416``) restarts the file;
* a connection cut mid-body is resumed within the same call (``ATTEMPTS`` transfers in all);
* a transfer stops as soon as it exceeds the expected size, so a wrong file cannot fill a disk;
* errors are :class:`~harness.errors.HarnessError` naming the file, and for a mismatch the
  expected and actual sha256 and size; URLs in messages lose their query (signed CDN URLs
  carry credentials there) and their user-info.

How bytes are received: a plain-HTTP body framed by ``Content-Length`` (a local mirror or
cache server, an index on the LAN) is moved by the kernel socket → pipe → file with
``os.splice`` while a second thread hashes what the file holds from the page cache
(:func:`_splice_body`); that costs about half the CPU of receiving into Python buffers and
writing them out, which on two cores decided the pace. Every other body (TLS, chunked, local
files, no ``os.splice``) is received into a pool of buffers that a writer thread and a hashing
thread drain (:class:`_Pipeline`). Both hash every byte before ``dest`` gets its name.

Sources are ``http(s)://`` and ``file://`` URLs and local paths. Credentials written in a URL
(``https://user:token@host/...``, as uv accepts for an index) become an ``Authorization:
Basic`` header; explicit ``headers`` (a hub token) are sent too. Both are *unredirected*:
credentials never follow a redirect to another host (a CDN).

:func:`measure` is the lock-time sibling: it downloads a file only to learn its sha256 and size.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import os
import re
import stat
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit, urlunsplit

from harness.errors import HarnessError
from harness.store.hashing import file_sha256

#: How a progress callback is told about bytes: called with the number of bytes added toward
#: the file's size (negative: bytes withdrawn because a transfer restarted from zero).
Progress = Callable[[int], None]

#: A place bytes come from: an ``http(s)://`` or ``file://`` URL (a ``str`` containing
#: ``://``), or a local path.
SourceLike = str | os.PathLike[str]

CHUNK = 4 << 20
#: Per socket operation, not per download: large files take as long as they take.
TIMEOUT_S = 60.0
#: Transfers interrupted mid-stream are resumed until this many have been made in all.
ATTEMPTS = 3
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


@dataclass(frozen=True)
class _Source:
    """Where one file's bytes come from: a URL with the headers to send, or a local path."""

    url: str | None = None
    path: Path | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return redact(self.url) if self.url is not None else str(self.path)


class _NotFound(Exception):
    """The source answered 400/404 before any byte arrived (another source may have it)."""


def download(
    source: SourceLike | Sequence[SourceLike],
    dest: Path,
    *,
    sha256: str,
    size: int,
    progress: Progress | None = None,
    headers: Mapping[str, str] | None = None,
    label: str | None = None,
) -> None:
    """Put the file of ``size`` bytes and ``sha256`` at ``dest``, streamed from ``source``.

    ``source`` is one URL or path, or a sequence of alternatives tried in order while they
    answer "not found" (HTTP 400/404) — e.g. a file's own revision, then its tag. ``headers``
    go with every HTTP request (never across a redirect). ``label`` names the file in errors
    (default: ``dest``'s name and the first source).

    Contract (module doc): on return ``dest`` holds exactly the expected bytes. A ``dest``
    already holding them is kept without a transfer; one holding other bytes is replaced. A
    ``<dest>.part`` from an interrupted call is resumed; if the resumed result does not match,
    it is discarded and the file fetched once more from zero. On a mismatch the ``.part`` is
    deleted, ``dest`` is absent, and :class:`HarnessError` names the file with expected and
    actual sha256 and size. An unreachable source, an HTTP error, a transfer cut off
    ``ATTEMPTS`` times or a failed write (a full disk: the ``.part`` is deleted to free the
    space) raise :class:`HarnessError` too. An exception raised by ``progress`` propagates
    unchanged and leaves the ``.part`` for a later resume (that is how a caller cancels).

    Safe to call in parallel for different ``dest``; callers serialize calls for the same one.

    ``progress`` is called with byte counts as they are added toward ``size``: bytes already
    present (a complete ``dest`` or a resumed ``.part``) are reported first, and a negative
    count withdraws bytes when a transfer restarts from zero, so the counts always sum to the
    bytes currently held.
    """
    report = progress or _ignore
    sources = _sources(source, headers)
    label = label or f"{dest.name} from {sources[0].describe()}"
    if os.path.lexists(dest):
        if _size(dest) == size and file_sha256(dest) == sha256:
            report(size)
            return
        try:
            dest.unlink()  # other bytes, or not a file (a link: never followed)
        except OSError as exc:
            raise _in_the_way(label, dest, exc) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")

    resumed = _size(part) > 0
    digest, got = _fetch_from(sources, part, size, report, label)
    if resumed and (got, digest) != (size, sha256):
        # The held bytes may be stale (another version of the file, a torn write): one clean retry.
        report(-_size(part))
        part.unlink(missing_ok=True)
        digest, got = _fetch_from(sources, part, size, report, label)
    if (got, digest) != (size, sha256):
        part.unlink(missing_ok=True)
        raise HarnessError(
            f"{label} does not match the lock: expected sha256 {sha256} ({size} bytes), "
            f"got sha256 {digest} ({got} bytes)",
            hint="the upstream changed or the transfer was corrupted; retry, or re-lock if the change is intended",
        )
    try:
        os.replace(part, dest)
    except OSError as exc:
        raise _in_the_way(label, dest, exc) from None


def _in_the_way(label: str, dest: Path, exc: OSError) -> HarnessError:
    """What stands where the finished file goes and cannot be replaced (in a shared home's
    download folder, a folder another member made under its name), said as an error."""
    from harness.store.entries import owner_of

    return HarnessError(
        f"{label}: cannot put the file at {dest}: {exc.strerror or exc} (made by {owner_of(dest)})",
        hint="its maker (or root) can remove it; nothing was written through it",
    )


def measure(
    source: SourceLike, scratch: Path, *, headers: Mapping[str, str] | None = None, label: str | None = None
) -> tuple[str, int]:
    """Download ``source`` only to learn it: return its (sha256, size).

    The bytes pass through a temporary file in ``scratch`` (created if missing), which is
    removed whatever happens. Errors as for :func:`download`, with "not found" one of them.
    """
    sources = _sources(source, headers)
    label = label or sources[0].describe()
    scratch.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="measure-", suffix=".part", dir=scratch)
    os.close(fd)
    part = Path(name)
    try:
        return _fetch_from(sources, part, None, _ignore, label)
    finally:
        part.unlink(missing_ok=True)


def redact(url: str) -> str:
    """``url`` without user-info, query or fragment: what error messages may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """Split ``user:password@`` out of ``url``: (the URL without it, headers carrying it).

    urllib cannot send credentials written in a URL; uv accepts them in index URLs, so
    harness does too, as HTTP Basic authentication.
    """
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = unquote(parts.username or "")
    password = unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), {
        "Authorization": f"Basic {token}"
    }


# ---------------------------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------------------------


def _ignore(_n: int) -> None:
    pass


def _sources(source: SourceLike | Sequence[SourceLike], headers: Mapping[str, str] | None) -> list[_Source]:
    items: Sequence[SourceLike] = [source] if isinstance(source, (str, os.PathLike)) else source
    if not items:
        raise ValueError("download needs at least one source")
    out = []
    for item in items:
        if isinstance(item, str) and "://" in item:
            url, auth = split_credentials(item)
            if url.startswith("file://"):
                out.append(_Source(path=Path(urllib.request.url2pathname(urlsplit(url).path))))
            else:
                out.append(_Source(url=url, headers={**auth, **(headers or {})}))
        else:
            out.append(_Source(path=Path(item)))
    return out


def _fetch_from(
    sources: list[_Source], part: Path, size: int | None, progress: Progress, label: str
) -> tuple[str, int]:
    """:func:`_transfer` from the first source that has the file."""
    for index, source in enumerate(sources):
        try:
            return _transfer(source, part, expected_size=size, progress=progress, label=label)
        except _NotFound as exc:
            if index == len(sources) - 1:
                raise HarnessError(f"{label}: {exc}") from None
    raise HarnessError(f"{label}: no source to fetch from")


class _Pipeline:
    """Receive → write → sha256 as three overlapping stages over a small pool of buffers.

    The receiving loop (the caller's thread) fills a buffer and submits it; one thread
    writes it to the partial file, another hashes it, then the buffer returns to the pool.
    File writes and hashlib both release the GIL, so the three overlap and the transfer
    runs at the pace of its slowest stage instead of their sum. A write error is kept and
    raised to the caller at its next :meth:`buffer` or at :meth:`finish`.
    """

    def __init__(self, out: BinaryIO, digest: Any, *, buffers: int = 6) -> None:
        import queue
        import threading

        self._out = out
        self._digest = digest
        self.error: OSError | None = None
        self._free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(buffers):
            self._free.put(bytearray(CHUNK))
        self._to_write: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._to_hash: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write, name="download-write", daemon=True)
        self._hasher = threading.Thread(target=self._hash, name="download-sha256", daemon=True)
        self._writer.start()
        self._hasher.start()

    def _write(self) -> None:
        while (item := self._to_write.get()) is not None:
            buf, n = item
            if self.error is None:
                try:
                    self._out.write(memoryview(buf)[:n])
                except OSError as exc:
                    self.error = exc
            self._to_hash.put(item)
        self._to_hash.put(None)

    def _hash(self) -> None:
        while (item := self._to_hash.get()) is not None:
            buf, n = item
            self._digest.update(memoryview(buf)[:n])
            self._free.put(buf)

    def buffer(self) -> bytearray:
        """A buffer to receive into (waits while every buffer is in flight)."""
        if self.error is not None:
            raise self.error
        return self._free.get()

    def submit(self, buf: bytearray, n: int) -> None:
        self._to_write.put((buf, n))

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def finish(self) -> None:
        """Wait until every submitted buffer is written and hashed; raise a write error."""
        if self._writer.is_alive():
            self._to_write.put(None)
            self._writer.join()
            self._hasher.join()
        if self.error is not None:
            raise self.error


class _Interrupted(Exception):
    """The stream broke off mid-body (connection reset, timeout, short body)."""


def _transfer(
    source: _Source, part: Path, *, expected_size: int | None, progress: Progress, label: str
) -> tuple[str, int]:
    """Complete ``part`` from ``source``, resuming what it holds; return its (sha256, size).

    Bytes already in ``part`` are hashed first and kept when the source honours a range
    request from their end; a source that restarts from zero truncates ``part``. Stops early
    once ``expected_size`` is exceeded; the caller compares size and hash.
    """
    from harness.store.entries import held_part, open_part, open_regular

    for attempt in range(ATTEMPTS):
        try:
            offset = held_part(part)  # a link or fifo planted there is removed, never followed
        except OSError as exc:
            raise _write_error(label, part, exc) from None
        if expected_size is not None and offset > expected_size:
            part.unlink()
            offset = 0
        digest = hashlib.sha256()
        if offset:
            with open_regular(part) as held:
                while chunk := held.read(CHUNK):
                    digest.update(chunk)
            progress(offset)
            if offset == expected_size:
                return digest.hexdigest(), offset
        stream, start, body = _open_stream(source, offset, label)
        if start != offset:  # the source restarted the file
            progress(-offset)
            digest = hashlib.sha256()
        try:
            with stream:
                try:
                    out = open_part(part, append=bool(start))
                except OSError as exc:
                    raise _write_error(label, part, exc) from None
                with out:
                    _seek(out, start, label, part)
                    if body is not None and _spliceable(stream, start + body, expected_size):
                        got = _splice_body(stream, out, start, body, digest, progress, label, part)
                        return digest.hexdigest(), got
                    got = start
                    pipe = _Pipeline(out, digest)
                    try:
                        while True:
                            buf = pipe.buffer()
                            try:
                                n = stream.readinto(buf)  # type: ignore[attr-defined]
                            except (http.client.HTTPException, OSError) as exc:
                                pipe.give_back(buf)
                                raise _Interrupted(repr(exc)) from None
                            if not n:
                                pipe.give_back(buf)
                                break
                            pipe.submit(buf, n)
                            got += n
                            progress(n)
                            if expected_size is not None and got > expected_size:
                                break
                    finally:
                        try:
                            pipe.finish()
                        except OSError as exc:
                            out.close()
                            raise _write_error(label, part, exc) from None
                    if expected_size is not None and got > expected_size:
                        return digest.hexdigest(), got
                    if body is not None and got - start < body:
                        # http.client returns a short body as a clean end of stream; it is not.
                        raise _Interrupted(f"{body - (got - start)} bytes short of the announced length")
            return digest.hexdigest(), got
        except _Interrupted as exc:
            if attempt == ATTEMPTS - 1:
                raise HarnessError(
                    f"{label}: transfer from {source.describe()} failed {ATTEMPTS} times: {exc}"
                ) from None
            progress(-_size(part))  # re-reported on resume
    raise AssertionError("unreachable")


def _size(path: Path) -> int:
    from harness.store.entries import regular_size

    return regular_size(path)


#: Bytes moved per splice: the most a pipe holds for an unprivileged user by default
#: (``/proc/sys/fs/pipe-max-size``); a smaller pipe just moves less per call.
SPLICE_STEP = 1 << 20


def _spliceable(stream: Any, end: int, expected_size: int | None) -> bool:
    """Whether ``stream``'s body can be moved socket → pipe → file by the kernel (:func:`_splice_body`).

    Yes for a plain-HTTP response with a ``Content-Length`` (identity framing: the socket's
    bytes after the headers are the body) on Linux. No for TLS (the socket carries ciphertext),
    chunked bodies (framing bytes interleave), local files, or a body that would overshoot the
    expected size (the receiving loop stops such a transfer early instead).
    """
    return (
        hasattr(os, "splice")
        and isinstance(stream, http.client.HTTPResponse)
        and not stream.chunked
        and stream.fp is not None
        and urlsplit(getattr(stream, "url", None) or "").scheme == "http"
        and (expected_size is None or end <= expected_size)
    )


class _FileHasher:
    """Hashes a file's bytes from the page cache as they land, on a thread of its own.

    The receiver writes with splice (no copy through Python) and calls :meth:`advance` with
    how far the file is written; the thread reads ``[hashed, written)`` back with ``pread``
    while they are still in the CPU cache and feeds them to the digest (hashlib releases the
    GIL), so hashing overlaps receiving. What is hashed is what the file holds: the bytes
    that will be kept. (``pread`` rather than ``mmap``: as fast here, and a file truncated
    underneath gives a short read instead of a SIGBUS.)
    """

    def __init__(self, fd: int, start: int, digest: Any) -> None:
        import threading

        self._fd = fd
        self._digest = digest
        self._hashed = start
        self._written = start
        self._state = threading.Condition()
        self._closing = False
        self._abandoned = False
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="download-sha256", daemon=True)
        self._thread.start()

    def advance(self, written: int) -> None:
        with self._state:
            self._written = written
            self._state.notify()

    def finish(self) -> None:
        """Wait until every written byte is hashed; raise a read error."""
        with self._state:
            self._closing = True
            self._state.notify()
        self._thread.join()
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        """Stop without hashing the rest (the transfer failed; the digest is not used)."""
        with self._state:
            self._abandoned = True
            self._state.notify()
        self._thread.join()

    def _run(self) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        pos = self._hashed
        while True:
            with self._state:
                while pos == self._written and not self._closing and not self._abandoned:
                    self._state.wait()
                if self._abandoned or pos == self._written:
                    return
                written = self._written
            while pos < written:
                try:
                    n = os.preadv(self._fd, [view[: min(CHUNK, written - pos)]], pos)
                except OSError as exc:
                    self.error = exc
                    return
                if not n:
                    self.error = OSError(errno.EIO, "the file shrank while being downloaded")
                    return
                self._digest.update(view[:n])
                pos += n


def _splice_body(
    response: BinaryIO,
    out: BinaryIO,
    start: int,
    body: int,
    digest: Any,
    progress: Progress,
    label: str,
    part: Path,
) -> int:
    """Receive ``body`` bytes of ``response`` into ``out`` from ``start``; return where it ends.

    The kernel moves them socket → pipe → file (``os.splice``: no copy through user space)
    while a :class:`_FileHasher` hashes what lands, so every kept byte is still hashed.
    Errors as for the receiving loop: a cut or stalled stream is :class:`_Interrupted` (the
    bytes written so far stay for a resume), a failed write a :class:`HarnessError`.
    """
    import fcntl
    import select

    assert isinstance(response, http.client.HTTPResponse)
    fd = out.fileno()
    sock = response.fileno()
    end = start + body
    got = start
    hasher = _FileHasher(fd, start, digest)
    finished = False
    read_pipe, write_pipe = os.pipe()
    try:
        try:
            fcntl.fcntl(write_pipe, fcntl.F_SETPIPE_SZ, SPLICE_STEP)
        except OSError:
            pass  # a smaller pipe (the user's pipe quota is spent) only moves less per call
        # http.client's buffered reader may already hold the first bytes of the body.
        assert response.fp is not None
        try:
            early = response.fp.read(min(len(response.fp.peek(1)), body))
        except (http.client.HTTPException, OSError) as exc:
            raise _Interrupted(repr(exc)) from None
        if early:
            _write_at(fd, early, got, label, part)
            got += len(early)
            hasher.advance(got)
            progress(len(early))
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        copying = False  # set when the file system refuses splice: copy out of the pipe instead
        while got < end:
            try:
                n = os.splice(sock, write_pipe, min(SPLICE_STEP, end - got), flags=_SPLICE_FLAGS)
            except BlockingIOError:  # the socket has a timeout, so it is non-blocking: wait for it
                if not poll.poll(TIMEOUT_S * 1000):
                    raise _Interrupted(f"no data for {TIMEOUT_S:.0f} s") from None
                continue
            except OSError as exc:
                raise _Interrupted(repr(exc)) from None
            if not n:
                raise _Interrupted(f"{end - got} bytes short of the announced length")
            left = n
            while left:
                if not copying:
                    try:
                        moved = os.splice(read_pipe, fd, left, offset_dst=got, flags=os.SPLICE_F_MOVE)
                    except OSError as exc:
                        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                            raise _write_error(label, part, exc) from None
                        copying = True
                        continue
                else:
                    chunk = os.read(read_pipe, left)
                    _write_at(fd, chunk, got, label, part)
                    moved = len(chunk)
                left -= moved
                got += moved
            hasher.advance(got)
            progress(n)
        try:
            hasher.finish()
        except OSError as exc:
            raise _write_error(label, part, exc) from None
        finished = True
        return got
    finally:
        if not finished:
            hasher.abandon()
        os.close(read_pipe)
        os.close(write_pipe)


def _write_at(fd: int, data: bytes, offset: int, label: str, part: Path) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view, offset)
        except OSError as exc:
            raise _write_error(label, part, exc) from None
        view = view[n:]
        offset += n


def _seek(out: BinaryIO, start: int, label: str, part: Path) -> None:
    try:
        out.seek(start)
        out.truncate()
    except OSError as exc:
        raise _write_error(label, part, exc) from None


def _write_error(label: str, part: Path, exc: OSError) -> HarnessError:
    # A full disk is the common case; removing the partial file gives the space back.
    part.unlink(missing_ok=True)
    return HarnessError(
        f"{label}: cannot write {part}: {exc.strerror or exc}",
        hint="free disk space (or fix permissions) and retry",
    )


def _open_stream(source: _Source, offset: int, label: str) -> tuple[BinaryIO, int, int | None]:
    """Open ``source`` for reading from ``offset``: (stream, where it starts, body length).

    The start is ``offset`` when the source honoured it and 0 when it sends the whole file;
    the body length is the announced ``Content-Length`` (None when not announced).
    """
    if source.path is not None:
        path = source.path
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise _NotFound(f"{path} does not exist") from None
        except OSError as exc:
            raise HarnessError(f"{label}: cannot read {path}: {exc.strerror}") from None
        start = offset if offset <= os.fstat(handle.fileno()).st_size else 0
        handle.seek(start)
        return handle, start, None
    response = _urlopen(source, offset, label)
    start = 0
    if offset and response.status == 206:
        match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
        if match and int(match.group(1)) == offset:
            start = offset
        else:  # a range we did not ask for: start over
            response.close()
            response = _urlopen(source, 0, label)
    # Otherwise no range was asked, or the server ignored it and sends the whole file.
    length = response.headers.get("Content-Length")
    return response, start, int(length) if length and length.isdigit() else None


_opener: urllib.request.OpenerDirector | None = None
_opener_lock = threading.Lock()


def _looked_up_once(connection: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    """``connection`` opening its socket on the host's addresses as this process last looked
    them up (:mod:`harness.hostnames`), not a lookup of its own."""

    class Connection(connection):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from harness.hostnames import connect

            super().__init__(*args, **kwargs)
            self._create_connection = connect

    Connection.__name__ = Connection.__qualname__ = connection.__name__
    return Connection


_HTTPConnection = _looked_up_once(http.client.HTTPConnection)
_HTTPSConnection = _looked_up_once(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


def open_url(request: urllib.request.Request | str, *, timeout: float) -> Any:
    """``urllib.request.urlopen`` through one TLS context for the whole process.

    urllib without a context makes a new one for every HTTPS connection, and making one loads
    the system's CA certificates: about 20 ms of CPU each, a quarter of a second for a realize
    that reads six index pages and six wheels. The context is the one urllib would make
    (``ssl.create_default_context``: ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` as this process
    started with them), with the ALPN and post-handshake settings ``http.client`` gives its
    own; an ``SSLContext`` is safe to share between threads. Each host is looked up once for
    all the threads that connect to it at once (:mod:`harness.hostnames`)."""
    global _opener
    with _opener_lock:  # realize's fetch threads all start at once: one context, not one each
        if _opener is None:
            import ssl

            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            if context.post_handshake_auth is not None:
                context.post_handshake_auth = True
            _opener = urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context=context))
        opener = _opener
    return opener.open(request, timeout=timeout)


def _urlopen(source: _Source, offset: int, label: str) -> Any:
    """GET ``source.url`` (from ``offset`` with a ``Range`` header); errors become ours."""
    assert source.url is not None
    request = urllib.request.Request(source.url, headers={"Accept-Encoding": "identity"})
    for key, value in source.headers.items():
        # Unredirected: credentials must not follow a redirect to a CDN or another host.
        request.add_unredirected_header(key, value)
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    where = redact(source.url)
    try:
        return open_url(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:
            return _urlopen(source, 0, label)  # the held bytes do not fit the file: start over
        if exc.code in (400, 404):
            raise _NotFound(f"HTTP {exc.code} from {where}") from None
        raise HarnessError(f"{label}: HTTP {exc.code} {exc.reason} from {where}") from None
    except urllib.error.URLError as exc:
        raise HarnessError(f"{label}: cannot reach {where}: {exc.reason}") from None
    except (http.client.HTTPException, OSError) as exc:
        raise HarnessError(f"{label}: cannot reach {where}: {exc!r}") from None


def read_checked(path: Path, *, sha256: str, size: int, where: str) -> bytes:
    """The bytes of the downloaded ``path``, read once (never through a link, at most
    ``size`` + 1 of them) and checked against the lock's ``sha256`` and ``size``:
    HarnessError naming ``where`` otherwise. For a download in a folder a group shares, which
    another member can change after :func:`download` checked it: what is used is what was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise HarnessError(f"{where}: cannot read the download {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(size + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != size or digest != sha256:
        from harness.store.entries import owner_of

        raise HarnessError(
            f"{where}: the download {path} changed after it was checked (now of {owner_of(path)}, "
            f"{len(data)}{'+' if len(data) > size else ''} bytes, sha256 {digest}; the lock says "
            f"{size} bytes, sha256 {sha256}); nothing was built from it",
            hint="run it again: the file is downloaded again; in a shared home, ask who changed it",
        )
    return data


def copy_checked(source: Path, dest: Path, *, sha256: str, size: int, where: str) -> None:
    """Copy the downloaded ``source`` to the new file ``dest`` (never through a link, at most
    ``size`` + 1 bytes), hashing what is written: HarnessError naming ``where``, the expected
    and the actual sha256 and size otherwise, and ``dest`` removed. The streaming form of
    :func:`read_checked`, for files too large to hold in memory (wheels, weights) taken from
    a folder others can write: what is kept is what was checked."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise HarnessError(f"{where}: cannot read the download {source}: {exc.strerror or exc}") from None
    digest = hashlib.sha256()
    got = 0
    with os.fdopen(fd, "rb") as handle, open(dest, "xb") as out:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            while got <= size and (chunk := handle.read(min(CHUNK, size + 1 - got))):
                digest.update(chunk)
                out.write(chunk)
                got += len(chunk)
    if got != size or digest.hexdigest() != sha256:
        from harness.store.entries import owner_of

        dest.unlink(missing_ok=True)
        raise HarnessError(
            f"{where}: the download {source} changed after it was checked (now of {owner_of(source)}, "
            f"{got}{'+' if got > size else ''} bytes, sha256 {digest.hexdigest()}; the lock says "
            f"{size} bytes, sha256 {sha256}); nothing was registered from it",
            hint="run it again: the file is downloaded again; in a shared home, ask who changed it",
        )


__all__ = [
    "ATTEMPTS",
    "CHUNK",
    "Progress",
    "SourceLike",
    "copy_checked",
    "download",
    "measure",
    "open_url",
    "read_checked",
    "redact",
    "split_credentials",
]
