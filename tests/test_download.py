"""The downloader's two receiving paths against a real local HTTP server.

A plain-HTTP body framed by ``Content-Length`` is moved socket → pipe → file with
``os.splice`` and hashed from the file; every other body (chunked, TLS, local files, no
``os.splice``) goes through the copying receive loop. Both must keep the contract of
:func:`harness.download.download`: the file appears only with the lock's size and sha256,
a mismatch names the file with expected and actual and leaves nothing, a cut body is
resumed. ``os.splice`` is wrapped (never replaced) to see which path ran.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.download import download, measure
from harness.errors import HarnessError

pytestmark = pytest.mark.skipif(not hasattr(os, "splice"), reason="os.splice is Linux-only")

DATA = hashlib.sha256(b"weights").digest() * (5 * (1 << 20) // 32 + 7)  # 5 MiB + 224 bytes: several steps


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Server:
    """Serves ``files`` over HTTP/1.1; ``mode`` says how a body is framed or broken."""

    files: dict[str, bytes]
    mode: str = "length"  # "length", "chunked", or "short" (announces all, sends half, closes)
    ranges: list[str | None] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)
    port: int = 0

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(files={})

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state.authorization.append(self.headers.get("Authorization"))
            if self.path.startswith("/moved/"):  # a hub's resolve URL sending the client on to its CDN
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/moved"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = state.files.get(self.path.lstrip("/"))
            if data is None:
                self.send_error(404)
                return
            wanted = self.headers.get("Range")
            state.ranges.append(wanted)
            start = int(wanted.removeprefix("bytes=").rstrip("-")) if wanted else 0
            body = data[start:]
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            if state.mode == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(0, len(body), 100_000):
                    piece = body[i : i + 100_000]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.mode == "short":
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def splices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each ``os.splice`` call moved into a file (the real call, counted)."""
    moved: list[int] = []
    real = os.splice

    def counting(src: int, dst: int, count: int, *args: Any, **kwargs: Any) -> int:
        n = real(src, dst, count, *args, **kwargs)
        if kwargs.get("offset_dst") is not None:
            moved.append(n)
        return n

    monkeypatch.setattr(os, "splice", counting)
    return moved


@pytest.mark.parametrize("data", [DATA, b"tiny body"], ids=["5MiB", "tiny"])
def test_content_length_body_is_spliced(server: Server, splices: list[int], tmp_path: Path, data: bytes) -> None:
    server.files["w.bin"] = data
    reported: list[int] = []
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(data), size=len(data), progress=reported.append)
    assert (tmp_path / "w.bin").read_bytes() == data
    assert sum(reported) == len(data)
    assert not (tmp_path / "w.bin.part").exists()
    if len(data) > 1 << 20:
        # Most of the body went through the kernel; the rest arrived with the headers.
        assert sum(splices) > len(data) - (1 << 16) and len(splices) > 1
    # A tiny body arrives whole with the headers: nothing is left to splice.
    assert measure(server.url("w.bin"), tmp_path / "scratch") == (sha(data), len(data))


def test_chunked_body_takes_the_copying_path(server: Server, splices: list[int], tmp_path: Path) -> None:
    server.files["w.bin"] = DATA
    server.mode = "chunked"
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert splices == []  # chunk framing interleaves the body: it cannot go to the file as is


def test_without_splice_the_copying_path_does_the_same(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "splice")
    server.files["w.bin"] = DATA
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA


def test_a_file_system_that_refuses_splice(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Some file systems have no splice_write: the bytes already in the pipe are copied out instead.
    real = os.splice
    refused: list[int] = []

    def no_file_splice(src: int, dst: int, count: int, *args: Any, **kwargs: Any) -> int:
        if kwargs.get("offset_dst") is not None:
            refused.append(count)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(src, dst, count, *args, **kwargs)

    monkeypatch.setattr(os, "splice", no_file_splice)
    server.files["w.bin"] = DATA
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert len(refused) == 1  # tried once, then copied


def test_spliced_mismatch_names_the_file_and_keeps_nothing(server: Server, splices: list[int], tmp_path: Path) -> None:
    server.files["w.bin"] = DATA
    wrong = "0" * 64
    with pytest.raises(HarnessError) as info:
        download(server.url("w.bin"), tmp_path / "w.bin", sha256=wrong, size=len(DATA))
    message = str(info.value)
    assert f"w.bin from {server.url('w.bin')} does not match the lock" in message
    assert f"expected sha256 {wrong} ({len(DATA)} bytes), got sha256 {sha(DATA)} ({len(DATA)} bytes)" in message
    assert splices  # the bytes were spliced, and still checked
    assert list(tmp_path.iterdir()) == []


def test_body_longer_than_the_lock_is_stopped(server: Server, tmp_path: Path) -> None:
    server.files["w.bin"] = DATA
    with pytest.raises(HarnessError, match=rf"expected sha256 {'1' * 64} \(1000 bytes\)"):
        download(server.url("w.bin"), tmp_path / "w.bin", sha256="1" * 64, size=1000)
    assert list(tmp_path.iterdir()) == []


def test_truncated_spliced_body(server: Server, splices: list[int], tmp_path: Path) -> None:
    server.files["w.bin"] = DATA
    server.mode = "short"
    with pytest.raises(HarnessError, match=r"w\.bin from .*: transfer from .* failed 3 times: .* bytes short"):
        download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert not (tmp_path / "w.bin").exists()
    # Each attempt resumed from what the last one left: the .part holds a prefix of the file.
    held = (tmp_path / "w.bin.part").read_bytes()
    assert len(held) > len(DATA) // 2 and DATA.startswith(held)
    assert server.ranges[0] is None and all(r and r.startswith("bytes=") for r in server.ranges[1:])

    # The next call resumes the .part with a Range request and completes the file.
    server.mode = "length"
    server.ranges.clear()
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert server.ranges == [f"bytes={len(held)}-"]
    assert not (tmp_path / "w.bin.part").exists()


def test_stale_part_is_replaced(server: Server, splices: list[int], tmp_path: Path) -> None:
    # A .part from another version of the file: resumed, found wrong, fetched once more from zero.
    server.files["w.bin"] = DATA
    (tmp_path / "w.bin.part").write_bytes(b"x" * 1000)
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert server.ranges == ["bytes=1000-", None]


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_what_is_planted_as_the_part_is_never_written_through(server: Server, tmp_path: Path, plant: str) -> None:
    """A link (to a file of the user's) or a fifo where the ``.part`` goes: what another member
    of a shared home can put in the group's download folder. The download neither writes
    through the link nor hangs on the fifo: the entry is replaced and the file fetched whole."""
    server.files["w.bin"] = DATA
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file\n")
    part = tmp_path / "w.bin.part"
    if plant == "link":
        part.symlink_to(victim)
    else:
        os.mkfifo(part)
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert victim.read_bytes() == b"the user's own file\n"
    assert not part.exists() and not part.is_symlink()


def test_a_folder_in_place_of_the_finished_file_is_a_clear_error(server: Server, tmp_path: Path) -> None:
    """A folder (not empty) under the file's own name cannot be replaced: an error naming it
    and who made it, never a traceback."""
    server.files["w.bin"] = DATA
    (tmp_path / "w.bin" / "inside").mkdir(parents=True)
    with pytest.raises(HarnessError, match=r"cannot put the file at .*w\.bin: .*\(made by "):
        download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))


def test_redirected_body_is_spliced_without_the_credentials(server: Server, splices: list[int], tmp_path: Path) -> None:
    server.files["w.bin"] = DATA
    download(
        server.url("moved/w.bin"),
        tmp_path / "w.bin",
        sha256=sha(DATA),
        size=len(DATA),
        headers={"Authorization": "Bearer hub-token"},
    )
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert sum(splices) > len(DATA) - (1 << 16)
    assert server.authorization == ["Bearer hub-token", None]  # the token stayed with the first host's request


def test_cancelled_by_progress_keeps_the_part(server: Server, splices: list[int], tmp_path: Path) -> None:
    # A caller cancels by raising from the progress callback: the exception propagates as it is,
    # the hashing thread stops, and the .part stays for the next call to resume.
    class Cancelled(Exception):
        pass

    server.files["w.bin"] = DATA
    seen: list[int] = []

    def cancel_after_a_mib(n: int) -> None:
        seen.append(n)
        if sum(seen) > 1 << 20:
            raise Cancelled

    with pytest.raises(Cancelled):
        download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA), progress=cancel_after_a_mib)
    held = (tmp_path / "w.bin.part").read_bytes()
    assert not (tmp_path / "w.bin").exists() and len(held) > 1 << 20 and DATA.startswith(held)
    assert not [t for t in threading.enumerate() if t.name == "download-sha256"]
    download(server.url("w.bin"), tmp_path / "w.bin", sha256=sha(DATA), size=len(DATA))
    assert (tmp_path / "w.bin").read_bytes() == DATA
    assert server.ranges[-1] == f"bytes={len(held)}-"


def _counting_lookups(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> list[str]:
    """Every ``getaddrinfo`` of a name (not of a numeric address), each taking 0.2 s so that
    threads asking at once overlap; ``fail``: each ends in the resolver's error."""
    import socket

    from harness import hostnames

    hostnames.forget()
    asked: list[str] = []
    real = socket.getaddrinfo

    def slow(host: str, *args: Any, **kwargs: Any) -> Any:
        if not host[:1].isdigit():
            asked.append(host)
            threading.Event().wait(0.2)
            if fail:
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    return asked


def test_downloads_at_once_look_their_host_up_once(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight files of one host downloaded at once (as realize's fetch threads start) ask the
    resolver for the host once, not once each: a resolver losing part of a burst of lookups
    cost 5 s per lost one (harness/hostnames.py)."""
    asked = _counting_lookups(monkeypatch)
    files = {f"f{i}.bin": hashlib.sha256(b"%d" % i).digest() * 1000 for i in range(8)}
    server.files.update(files)
    start = threading.Barrier(len(files))
    errors: list[BaseException] = []

    def fetch(name: str) -> None:
        start.wait()
        try:
            data = files[name]
            download(f"http://localhost:{server.port}/{name}", tmp_path / name, sha256=sha(data), size=len(data))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fetch, args=(name,)) for name in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert {name: (tmp_path / name).read_bytes() for name in files} == files
    assert asked == ["localhost"]


def test_a_failed_lookup_fails_the_threads_that_waited_for_it_and_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from harness import hostnames

    asked = _counting_lookups(monkeypatch, fail=True)
    start = threading.Barrier(4)
    raised: list[BaseException] = []

    def look_up() -> None:
        start.wait()
        try:
            hostnames.addresses("index.invalid", 443)
        except OSError as exc:
            raised.append(exc)

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(raised) == 4 and all(isinstance(exc, socket.gaierror) for exc in raised)
    assert asked == ["index.invalid"]
    with pytest.raises(socket.gaierror):
        hostnames.addresses("index.invalid", 443)  # a later attempt asks again
    assert asked == ["index.invalid", "index.invalid"]
