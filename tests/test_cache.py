"""Binary caches: push from one home, pull into another, and refuse everything bad.

Real counterparts only: two HARNESS_HOMEs at different depths on this machine, a directory
cache, an S3-compatible server on loopback (moto's server mode) and a plain HTTP server
serving a directory cache (with ranges, and with switches that cut transfers short or make
the cache vanish). Bad archives are written byte by byte here, from the NAR grammar in
``store/README.md``, not with the code under test.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import blake3
import pytest
import zstandard

from harness.cache.backends import open_backend
from harness.cache.format import (
    CacheConfigError,
    CacheError,
    NarInfo,
    archive_key,
    narinfo_key,
)
from harness.cache.signing import generate, parse_trusted, write_key_pair
from harness.cache.substitute import substitute
from harness.cache.transfer import (
    ExpectedContent,
    PullResult,
    open_substituters,
    pull,
    push,
)
from harness.store.hashing import store_hash, store_path_name
from harness.store.store import BuildResult, Store
from harness.store.verify import verify_store

KEY = generate("lab-cache-1")
OTHER_KEY = generate("lab-cache-1")  # same name, different key: must not verify
TRUSTED = [KEY.public().render()]


# ------------------------------------------------------------------------------ closures


def _name(kind: str, name: str, inputs: dict) -> str:
    return store_path_name(store_hash(kind, name, inputs), name)


@dataclass
class Closure:
    """A synthetic realized closure: the kinds a lock realizes, with the same shapes."""

    wheel: str
    source: str
    weights: str
    view: str
    python: str
    env: str
    expected: dict[str, ExpectedContent] = field(default_factory=dict)

    @property
    def roots(self) -> list[str]:
        return [self.env, self.view, self.wheel]

    @property
    def every(self) -> list[str]:
        return [self.wheel, self.source, self.weights, self.view, self.python, self.env]


WHEEL_FILE = "demo-1.0-py3-none-any.whl"


def populate(store: Store, *, weight_bytes: int = 200_000, seed: int = 0) -> Closure:
    """Register a closure in ``store`` with Store.add, as realize would lay it out."""
    rng = __import__("random").Random(seed)
    wheel_data = b"PK\x03\x04 not really a zip " + rng.randbytes(5000)
    wheel_sha = hashlib.sha256(wheel_data).hexdigest()
    weights_files = {"model.bin": rng.randbytes(weight_bytes), "sub/config.json": b'{"layers": 2}\n'}
    weights_sha = {p: hashlib.sha256(d).hexdigest() for p, d in weights_files.items()}

    wheel = _name("file", WHEEL_FILE, {"sha256": wheel_sha})
    source = _name("source", "demo-src", {"seed": seed})
    weights = _name("weights", "demo-model", {"files": sorted(weights_sha.items())})
    view = _name("weights-view", "demo-weights", {"links": {"model": weights}})
    python = _name("python", "cpython-3.11.7-host", {"seed": seed})  # a host copy: a name of its own
    env = _name("environment", "demo-env", {"python": python, "source": source})

    def build_wheel(out: Path) -> BuildResult:
        out.mkdir()
        (out / WHEEL_FILE).write_bytes(wheel_data)
        return BuildResult(obtained="index pypi")

    def build_source(out: Path) -> BuildResult:
        (out / "demo").mkdir(parents=True)
        (out / "demo" / "__init__.py").write_text("VALUE = 42\n")
        (out / "README").write_text("demo\n")
        (out / "docs").symlink_to("README")  # a link inside the path
        return BuildResult(obtained="git file:///demo 0123")

    def build_weights(out: Path) -> BuildResult:
        for rel, data in weights_files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
        return BuildResult(obtained="path services/assets")

    def build_view(out: Path) -> BuildResult:
        out.mkdir()
        (out / "model").symlink_to(f"../{weights}")  # relative: the same in every home
        return BuildResult(obtained="links")

    def build_python(out: Path) -> BuildResult:
        (out / "bin").mkdir(parents=True)
        exe = out / "bin" / "python3.11"
        exe.write_text('#!/bin/sh\necho "python at $(readlink -f "$0")"\n')
        exe.chmod(0o755)
        (out / "bin" / "python3").symlink_to("python3.11")
        (out / "lib" / "python3.11").mkdir(parents=True)
        (out / "lib" / "python3.11" / "os.py").write_text("# stdlib\n")
        return BuildResult(obtained="host /usr/bin/python3.11", impure="host: /usr/bin/python3.11")

    def build_env(out: Path) -> BuildResult:
        (out / "bin").mkdir(parents=True)
        (out / "bin" / "python").symlink_to(f"../../{python}/bin/python3.11")
        run = out / "bin" / "run"
        run.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" "$@"\n')
        run.chmod(0o755)
        site = out / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (site / "demo.pth").write_text(f"../../../../{source}\n")
        (out / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
        return BuildResult(obtained="uv 0.13.9")

    store.add(wheel, "file", build_wheel)
    source_record = store.add(source, "source", build_source)
    store.add(weights, "weights", build_weights)
    store.add(view, "weights-view", build_view, references=(weights,))
    store.add(python, "python", build_python)
    store.add(env, "environment", build_env, references=(python, source))
    closure = Closure(wheel, source, weights, view, python, env)
    closure.expected = {
        wheel: ExpectedContent("file", files={WHEEL_FILE: wheel_sha}),
        source: ExpectedContent("source", content=source_record.content),
        weights: ExpectedContent("weights", files=weights_sha),
    }
    return closure


@pytest.fixture
def homes(tmp_path: Path) -> tuple[Path, Path]:
    """Two homes at different paths and depths."""
    return tmp_path / "machine-a" / "home", tmp_path / "b" / "deeper" / "still" / "other-home"


def _pull(
    store: Store,
    urls: list[str],
    names: list[str],
    *,
    trusted: list[str] = TRUSTED,
    expected: dict[str, ExpectedContent] | None = None,
    cache_dir: Path,
) -> PullResult:
    subs, warnings = open_substituters(urls)
    assert subs, warnings
    return pull(
        store, names, subs, trusted=parse_trusted(trusted), expected=expected or {}, cache_dir=cache_dir, jobs=4
    )


def _assert_untouched(store: Store) -> None:
    """Nothing registered, nothing left behind in the store folder."""
    assert list(store.records()) == []
    if store.root.is_dir():
        assert [p.name for p in store.root.iterdir() if not p.name.startswith(".")] == []
        assert not store.tmp_dir.is_dir() or list(store.tmp_dir.iterdir()) == []


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_ino)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _run_from(store: Store, closure: Closure) -> str:
    proc = subprocess.run(
        [str(store.root / closure.env / "bin" / "run")], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout.strip()


# ---------------------------------------------------------------------- local servers


class CacheServer:
    """A static file server for a directory cache: GET/HEAD with ``Range: bytes=N-``.

    ``cut_after``: archive responses stop after that many body bytes (the connection closes
    with the announced length unmet); ``vanish``: after such a cut the cache folder is
    deleted, so every later request finds nothing.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: int | None = None
        self.vanish = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, *, body: bool) -> None:
                rel = unquote(self.path.split("?")[0]).lstrip("/")
                server.requests.append((rel, self.headers.get("Range")))
                path = server.root / rel
                if ".." in rel.split("/") or not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                start = 0
                match = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
                if match and int(match.group(1)) < len(data):
                    start = int(match.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return
                payload = data[start:]
                if server.cut_after is not None and "/nar/" in f"/{rel}":
                    self.wfile.write(payload[: server.cut_after])
                    self.wfile.flush()
                    self.close_connection = True
                    if server.vanish:
                        shutil.rmtree(server.root, ignore_errors=True)
                    return
                self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/cache"

    def __enter__(self) -> CacheServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, CacheServer]]:
    """A directory cache at ``<root>/cache`` and an HTTP server over ``<root>``."""
    root = tmp_path / "www"
    (root / "cache").mkdir(parents=True)
    with CacheServer(root) as server:
        yield root / "cache", server


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A fresh bucket on the loopback S3 server; credentials through the standard AWS chain."""
    import boto3

    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    bucket = f"cache-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return moto_endpoint, bucket, client


# ------------------------------------------------------------------ round trips, per kind


def _round_trip_checks(home_b: Path, closure: Closure, a: Store, harness_cli) -> None:  # type: ignore[no-untyped-def]
    b = Store.in_home(home_b)
    for name in closure.every:
        record_a, record_b = a.record(name), b.record(name)
        assert record_b is not None, name
        assert (record_b.content, record_b.kind, record_b.references) == (
            record_a.content,
            record_a.kind,
            record_a.references,
        )
        assert record_b.obtained.startswith("cache ")
    assert b.record(closure.python).impure == "host: /usr/bin/python3.11"
    result = harness_cli("--home", str(home_b), "store", "verify", "--check-contents")
    assert result.code == 0, result.out + result.err
    # The service runs from B: its links resolve inside B's store, wherever B is.
    assert _run_from(b, closure) == f"python at {b.root.resolve() / closure.python / 'bin' / 'python3.11'}"
    assert (b.root / closure.view / "model" / "sub" / "config.json").read_text() == '{"layers": 2}\n'


def test_directory_cache_round_trip_between_homes(homes, tmp_path: Path, harness_cli) -> None:  # type: ignore[no-untyped-def]
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    cache = tmp_path / "nfs" / "cache"
    result = push(a, closure.roots, open_backend(f"file://{cache}"), secret=KEY, cache_dir=home_a / "cache")
    assert sorted(result.pushed) == sorted(closure.every) and result.present == []
    # Metadata only after archives and references: every narinfo's archive and refs exist.
    for name in closure.every:
        info = NarInfo.parse((cache / narinfo_key(name)).read_text(), name)
        assert (cache / info.url).is_file()
        assert all((cache / narinfo_key(ref)).is_file() for ref in info.references)

    before = _snapshot(cache)
    again = push(a, closure.roots, open_backend(str(cache)), secret=KEY, cache_dir=home_a / "cache")
    assert (again.puts, again.uploaded_bytes, again.pushed) == (0, 0, [])
    assert sorted(again.present) == sorted(closure.every)
    assert _snapshot(cache) == before  # nothing written at all

    b = Store.in_home(home_b)
    pulled = _pull(b, [str(cache)], closure.roots, expected=closure.expected, cache_dir=home_b / "cache")
    assert pulled.failed == {}
    assert sorted(pulled.registered) == sorted(closure.every)
    order = pulled.registered
    assert order.index(closure.python) < order.index(closure.env)
    assert order.index(closure.weights) < order.index(closure.view)
    _round_trip_checks(home_b, closure, a, harness_cli)
    # A second pull has nothing to do.
    assert _pull(b, [str(cache)], closure.roots, cache_dir=home_b / "cache").registered == []


def test_s3_cache_round_trip_with_multipart(homes, s3, harness_cli) -> None:  # type: ignore[no-untyped-def]
    endpoint, bucket, client = s3
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a, weight_bytes=6 << 20)  # over the 5 MiB threshold set below
    url = f"s3://{bucket}/lab/cache?endpoint={endpoint}&multipart-threshold={5 << 20}"
    result = push(a, closure.roots, open_backend(url), secret=KEY, cache_dir=home_a / "cache")
    assert sorted(result.pushed) == sorted(closure.every)
    weights_info = NarInfo.parse(
        client.get_object(Bucket=bucket, Key=f"lab/cache/{narinfo_key(closure.weights)}")["Body"].read().decode(), ""
    )
    etag = client.head_object(Bucket=bucket, Key=f"lab/cache/{weights_info.url}")["ETag"]
    assert re.search(r"-\d+\"?$", etag), f"not a multipart upload: {etag}"

    def listing() -> dict[str, tuple[str, object]]:
        objects = client.list_objects_v2(Bucket=bucket)["Contents"]
        return {o["Key"]: (o["ETag"], o["LastModified"]) for o in objects}

    before = listing()
    again = push(a, closure.roots, open_backend(url), secret=KEY, cache_dir=home_a / "cache")
    assert (again.puts, again.uploaded_bytes, again.pushed) == (0, 0, [])
    assert listing() == before

    # The endpoint can come from the standard AWS setting instead of the URL.
    os.environ["AWS_ENDPOINT_URL"] = endpoint  # restored by the s3 fixture's monkeypatch
    b = Store.in_home(home_b)
    pulled = _pull(
        b, [f"s3://{bucket}/lab/cache"], closure.roots, expected=closure.expected, cache_dir=home_b / "cache"
    )
    assert pulled.failed == {} and sorted(pulled.registered) == sorted(closure.every)
    assert pulled.downloaded_bytes > 6 << 20
    assert list((home_b / "cache" / "nar").glob("*.nar.zst*")) == []  # downloads cleaned up
    _round_trip_checks(home_b, closure, a, harness_cli)


def test_http_cache_is_read_only_and_pulls(homes, served, harness_cli) -> None:  # type: ignore[no-untyped-def]
    cache, server = served
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    push(a, closure.roots, open_backend(str(cache)), secret=KEY, cache_dir=home_a / "cache")
    with pytest.raises(CacheError, match="read-only"):
        push(a, closure.roots, open_backend(server.url), secret=KEY, cache_dir=home_a / "cache")
    b = Store.in_home(home_b)
    pulled = _pull(b, [server.url], closure.roots, expected=closure.expected, cache_dir=home_b / "cache")
    assert pulled.failed == {} and sorted(pulled.registered) == sorted(closure.every)
    _round_trip_checks(home_b, closure, a, harness_cli)


def test_cli_keygen_push_pull(homes, tmp_path: Path, harness_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # outside any project
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    made = harness_cli("store", "keygen", "ci-1", "--dir", str(tmp_path / "keys"))
    assert made.code == 0, made.err
    secret, public = tmp_path / "keys" / "ci-1.secret", tmp_path / "keys" / "ci-1.public"
    assert (secret.stat().st_mode & 0o777) == 0o600
    assert harness_cli("store", "keygen", "ci-1", "--dir", str(tmp_path / "keys")).code != 0  # no overwrite
    cache = tmp_path / "cache"
    out = harness_cli(
        "--home", str(home_a), "store", "push", str(cache), closure.env, closure.view, "--key", str(secret)
    )
    assert out.code == 0, out.err
    assert "pushed 5 path(s)" in out.out
    out = harness_cli(
        "--home", str(home_a), "store", "push", str(cache), closure.env, closure.view, "--key", str(secret)
    )
    assert "pushed 0 path(s) (0.0 MiB uploaded), 5 already" in out.out
    # Without the public key, built paths are refused; with it, everything arrives.
    refused = harness_cli("--home", str(home_b), "store", "pull", str(cache), closure.env)
    assert refused.code == 1 and "not signed by a trusted key" in refused.err
    _assert_untouched(Store.in_home(home_b))
    out = harness_cli(
        "--home", str(home_b), "store", "pull", str(cache), "--all", "--trusted-key", public.read_text().strip()
    )
    assert out.code == 0, out.err
    assert "pulled 5 path(s)" in out.out
    assert harness_cli("--home", str(home_b), "store", "verify", "--check-contents").code == 0


# -------------------------------------------------------------------------- signatures


def test_signatures_decide_built_paths_hashes_decide_fixed_output(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home_a, _home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    unsigned, foreign = tmp_path / "unsigned", tmp_path / "foreign"
    push(a, closure.roots, open_backend(str(unsigned)), secret=None, cache_dir=home_a / "cache")
    push(a, closure.roots, open_backend(str(foreign)), secret=OTHER_KEY, cache_dir=home_a / "cache")
    fixed = {closure.wheel, closure.source, closure.weights}

    for cache, why in (
        (unsigned, "not signed, and a built path needs a signature"),
        (foreign, "not signed by a trusted key"),
    ):
        b = Store(tmp_path / f"b-{cache.name}" / "store")
        pulled = _pull(b, [str(cache)], closure.every, expected=closure.expected, cache_dir=tmp_path / "dl")
        # Fixed-output paths are trusted by the lock's hashes, without any signature.
        assert set(pulled.registered) == fixed
        assert set(pulled.failed) == {closure.env, closure.view, closure.python}
        assert why in pulled.failed[closure.python]
        assert {r.name for r in b.records()} == fixed

    # Without the lock's expectations, nothing unsigned is trusted.
    b = Store(tmp_path / "b-none" / "store")
    pulled = _pull(b, [str(unsigned)], closure.every, expected={}, cache_dir=tmp_path / "dl")
    assert pulled.registered == [] and set(pulled.failed) == set(closure.every)

    # A signed narinfo edited afterwards (one reference dropped) no longer verifies.
    signed = tmp_path / "signed"
    push(a, closure.roots, open_backend(str(signed)), secret=KEY, cache_dir=home_a / "cache")
    info_path = signed / narinfo_key(closure.env)
    text = info_path.read_text()
    info_path.write_text(text.replace(f"References: {closure.python} ", "References: "))
    b = Store(tmp_path / "b-edited" / "store")
    pulled = _pull(b, [str(signed)], [closure.env], cache_dir=tmp_path / "dl")
    assert "signatures by lab-cache-1 do not verify" in pulled.failed[closure.env]
    _assert_untouched(b)


def test_fixed_output_paths_must_match_the_lock(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home_a, _ = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    cache = tmp_path / "cache"
    push(a, closure.roots, open_backend(str(cache)), secret=None, cache_dir=home_a / "cache")
    wrong = {
        closure.wheel: ExpectedContent("file", files={WHEEL_FILE: "0" * 64}),
        closure.weights: ExpectedContent("weights", files={"model.bin": "1" * 64}),
        closure.source: ExpectedContent("source", content="blake3:" + "2" * 64),
    }
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], list(wrong), expected=wrong, cache_dir=tmp_path / "dl")
    assert pulled.registered == []
    assert "has sha256" in pulled.failed[closure.wheel] and "the lock says" in pulled.failed[closure.wheel]
    assert "unexpected 'sub/config.json'" in pulled.failed[closure.weights]
    assert "is not the lock's" in pulled.failed[closure.source]
    _assert_untouched(b)
    kind = {closure.wheel: ExpectedContent("weights", files={WHEEL_FILE: "0" * 64})}
    assert (
        "the lock a 'weights'"
        in _pull(b, [str(cache)], list(kind), expected=kind, cache_dir=tmp_path / "dl").failed[closure.wheel]
    )


# ------------------------------------------------------------------- hand-made archives


def _s(data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return len(data).to_bytes(8, "little") + data + b"\0" * (-len(data) % 8)


def _file(contents: bytes = b"x\n", executable: bool = False) -> bytes:
    flag = _s("executable") + _s("") if executable else b""
    return _s("(") + _s("type") + _s("regular") + flag + _s("contents") + _s(contents) + _s(")")


def _link(target: str) -> bytes:
    return _s("(") + _s("type") + _s("symlink") + _s("target") + _s(target) + _s(")")


def _dir(*entries: tuple[str, bytes]) -> bytes:
    body = b"".join(
        _s("entry") + _s("(") + _s("name") + _s(name) + _s("node") + node + _s(")") for name, node in entries
    )
    return _s("(") + _s("type") + _s("directory") + body + _s(")")


def _nar(node: bytes) -> bytes:
    return _s("nix-archive-1") + node


def publish(
    cache: Path,
    name: str,
    nar: bytes,
    *,
    kind: str = "environment",
    refs: tuple[str, ...] = (),
    content: str | None = None,
    nar_size: int | None = None,
    archive: bytes | None = None,
    key=KEY,
    impure: str | None = None,
) -> NarInfo:  # type: ignore[no-untyped-def]
    """Write one path into a directory cache by hand (cache-info, archive, signed narinfo)."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "harness-cache-info").write_text("Format: harness-cache-1\nCompression: zstd\nPriority: 40\n")
    compressed = zstandard.ZstdCompressor().compress(nar)
    file_hash = f"blake3:{blake3.blake3(compressed).hexdigest()}"
    (cache / "nar").mkdir(exist_ok=True)
    (cache / archive_key(file_hash)).write_bytes(archive if archive is not None else compressed)
    info = NarInfo(
        store_path=name,
        kind=kind,
        url=archive_key(file_hash),
        file_hash=file_hash,
        file_size=len(archive if archive is not None else compressed),
        content=content or f"blake3:{blake3.blake3(nar).hexdigest()}",
        nar_size=len(nar) if nar_size is None else nar_size,
        references=tuple(sorted(refs)),
        impure=impure,
    )
    if key is not None:
        info = info.with_signatures([key.sign(info)])
    (cache / narinfo_key(name)).write_text(info.render())
    return info


BAD = _name("environment", "bad-env", {})
SIBLING = _name("python", "cpython-3.11.7", {"bad": True})


def _bad_cases() -> dict[str, tuple[dict, str]]:
    ok_file = _file()
    bad_padding = (
        _s("(") + _s("type") + _s("regular") + _s("contents") + (3).to_bytes(8, "little") + b"abcXYZ\0\0" + _s(")")
    )
    zeros = b"\0" * 64
    return {
        "absolute entry name": ({"nar": _nar(_dir(("/etc", ok_file)))}, "absolute or climbing path"),
        "dot-dot entry name": ({"nar": _nar(_dir(("..", ok_file)))}, "absolute or climbing path"),
        "absolute symlink": ({"nar": _nar(_dir(("passwd", _link("/etc/passwd"))))}, "is absolute"),
        "symlink out of the store": (
            {"nar": _nar(_dir(("x", _link("../../../etc/passwd"))))},
            "points out of the store",
        ),
        "symlink to a non-reference": (
            {"nar": _nar(_dir(("x", _link(f"../{SIBLING}/bin/python3.11"))))},
            "not one of its references",
        ),
        "symlink climbing after descending": (
            {
                "nar": _nar(_dir(("d", _link(".")), ("x", _link("d/../../..")))),
            },
            "climbs after descending",
        ),
        "device file": (
            {"nar": _nar(_dir(("dev", _s("(") + _s("type") + _s("character") + _s(")"))))},
            "device, fifo or other special file",
        ),
        "duplicate entries": ({"nar": _nar(_dir(("a", ok_file), ("a", ok_file)))}, "appears twice"),
        "unsorted entries": ({"nar": _nar(_dir(("b", ok_file), ("a", ok_file)))}, "must be sorted"),
        "non-zero padding": ({"nar": _nar(bad_padding)}, "non-zero padding"),
        "content hash mismatch": (
            {"nar": _nar(_dir(("a", ok_file))), "content": "blake3:" + "ab" * 32},
            "content hash mismatch",
        ),
        "NAR longer than NarSize": (
            {"nar": _nar(_dir(("a", _file(zeros)))), "nar_size": 200},
            "longer than its NarSize",
        ),
        "bytes after the NAR": (
            {"nar": _nar(_dir(("a", ok_file))) + zeros, "nar_size": len(_nar(_dir(("a", ok_file)))) + 64},
            "bytes after the end",
        ),
        "archive not its FileHash": (
            {
                "nar": _nar(_dir(("a", ok_file))),
                "archive": zstandard.ZstdCompressor().compress(_nar(_dir(("b", ok_file)))),
            },
            "FileSize|FileHash",
        ),
        "not zstd": ({"nar": _nar(_dir(("a", ok_file))), "archive": b"\0" * 40}, "not valid zstd|FileSize"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_archives_are_refused_before_registration(case: str, tmp_path: Path) -> None:
    arguments, message = _bad_cases()[case]
    cache = tmp_path / "cache"
    publish(cache, BAD, **arguments)
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert pulled.registered == []
    assert re.search(message, pulled.failed[BAD]), pulled.failed[BAD]
    _assert_untouched(b)


def test_a_good_hand_made_archive_is_accepted(tmp_path: Path) -> None:
    """The control for the bad cases: the same writer, valid bytes, registers."""
    cache = tmp_path / "cache"
    sibling = _nar(_dir(("bin", _dir(("python3.11", _file(b"#!/bin/sh\n", executable=True))))))
    publish(cache, SIBLING, sibling, kind="python")
    publish(
        cache,
        BAD,
        _nar(_dir(("a", _file()), ("b", _link("a")), ("py", _link(f"../{SIBLING}/bin/python3.11")))),
        refs=(SIBLING,),
    )
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert pulled.failed == {} and pulled.registered == [SIBLING, BAD]
    assert os.access(b.root / BAD / "py", os.X_OK)


def test_missing_reference_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    publish(cache, BAD, _nar(_dir(("py", _link(f"../{SIBLING}/bin/python3.11")))), refs=(SIBLING,))
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert f"its reference {SIBLING} cannot be had" in pulled.failed[BAD]
    _assert_untouched(b)


def test_narinfo_cannot_point_outside_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    info = publish(cache, BAD, _nar(_dir(("a", _file()))))
    text = (cache / narinfo_key(BAD)).read_text().replace(info.url, "nar/../../../etc/passwd")
    (cache / narinfo_key(BAD)).write_text(text)
    b = Store(tmp_path / "b" / "store")
    assert "is not nar/<FileHash hex>.nar.zst" in _pull(b, [str(cache)], [BAD], cache_dir=tmp_path / "dl").failed[BAD]


def test_push_refuses_a_path_modified_since_registration(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home_a, _ = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    target = a.root / closure.source / "README"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text("tampered\n")
    with pytest.raises(CacheError, match="changed since it was registered"):
        push(a, [closure.env], open_backend(str(tmp_path / "cache")), secret=KEY, cache_dir=home_a / "cache")
    # Its referrer was not described either: no half-published closure.
    assert not (tmp_path / "cache" / narinfo_key(closure.env)).exists()
    assert not (tmp_path / "cache" / narinfo_key(closure.source)).exists()
    assert (tmp_path / "cache" / narinfo_key(closure.python)).exists()


# ------------------------------------------------------------ transfers cut short


def test_cache_vanishing_mid_transfer_registers_nothing(homes, served) -> None:  # type: ignore[no-untyped-def]
    cache, server = served
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a, weight_bytes=1 << 20)
    push(a, [closure.weights], open_backend(str(cache)), secret=KEY, cache_dir=home_a / "cache")
    server.cut_after, server.vanish = 100_000, True
    b = Store.in_home(home_b)
    pulled = _pull(b, [server.url], [closure.weights], expected=closure.expected, cache_dir=home_b / "cache")
    assert not cache.exists(), (pulled, server.requests)
    assert re.search(r"broke off|has no nar/", pulled.failed[closure.weights]), pulled.failed
    _assert_untouched(b)


def test_archive_deleted_from_a_directory_cache(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    cache = tmp_path / "cache"
    push(a, [closure.weights], open_backend(str(cache)), secret=KEY, cache_dir=home_a / "cache")
    for archive in (cache / "nar").iterdir():
        archive.unlink()
    b = Store.in_home(home_b)
    pulled = _pull(b, [str(cache)], [closure.weights], expected=closure.expected, cache_dir=home_b / "cache")
    assert "(deleted?)" in pulled.failed[closure.weights]
    _assert_untouched(b)


def _pushed_weights(homes: tuple[Path, Path], cache: Path, size: int) -> tuple[Closure, NarInfo]:
    """Home a's weights path of ``size`` bytes pushed (signed) to the directory cache ``cache``,
    and its narinfo there."""
    a = Store.in_home(homes[0])
    closure = populate(a, weight_bytes=size)
    push(a, [closure.weights], open_backend(str(cache)), secret=KEY, cache_dir=homes[0] / "cache")
    return closure, NarInfo.parse((cache / narinfo_key(closure.weights)).read_text(), "")


def test_interrupted_pull_resumes_with_a_range_request(homes, served, harness_cli) -> None:  # type: ignore[no-untyped-def]
    cache, server = served
    _, home_b = homes
    closure, info = _pushed_weights(homes, cache, 2 << 20)
    server.cut_after = 300_000
    b = Store.in_home(home_b)
    first = _pull(b, [server.url], [closure.weights], expected=closure.expected, cache_dir=home_b / "cache")
    assert "broke off" in first.failed[closure.weights]
    _assert_untouched(b)
    part = home_b / "cache" / "nar" / f"{info.file_hash.removeprefix('blake3:')}.nar.zst.part"
    held = part.stat().st_size
    assert 0 < held < info.file_size

    server.cut_after = None
    server.requests.clear()
    second = _pull(b, [server.url], [closure.weights], expected=closure.expected, cache_dir=home_b / "cache")
    assert second.registered == [closure.weights], second.failed
    assert (f"cache/{info.url}", f"bytes={held}-") in server.requests
    assert not part.exists()
    assert harness_cli("--home", str(home_b), "store", "verify", "--check-contents").code == 0


def test_a_link_in_place_of_a_pulls_partial_archive_is_never_written_through(homes, served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``cache/nar`` is the group's in a shared home: a link another member put where a pull's
    ``.part`` goes (to a file of the puller's) is removed, not resumed into, and the archive
    comes whole. Before, the pull appended the archive's bytes to the linked file."""
    cache, server = served
    _, home_b = homes
    closure, info = _pushed_weights(homes, cache, 1 << 20)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the puller's own file\n")
    nar = home_b / "cache" / "nar"
    nar.mkdir(parents=True)
    (nar / f"{info.file_hash.removeprefix('blake3:')}.nar.zst.part").symlink_to(victim)
    b = Store.in_home(home_b)
    pulled = _pull(b, [server.url], [closure.weights], expected=closure.expected, cache_dir=home_b / "cache")
    assert pulled.registered == [closure.weights], pulled.failed
    assert victim.read_bytes() == b"the puller's own file\n"
    assert "bytes=" not in " ".join(r for _, r in server.requests if r), "nothing was resumed"
    # A folder (with a file in it) under the archive's own name: that path is not substituted,
    # with a message naming the entry, and the pull goes on (realize builds it instead).
    c = Store(tmp_path / "c" / "store")
    blocked = tmp_path / "c-cache" / "nar" / f"{info.file_hash.removeprefix('blake3:')}.nar.zst"
    (blocked / "inside").mkdir(parents=True)
    pulled = _pull(c, [server.url], [closure.weights], expected=closure.expected, cache_dir=tmp_path / "c-cache")
    assert pulled.registered == [] and "cannot keep the archive at" in pulled.failed[closure.weights], pulled.failed


def test_a_directory_cache_never_reads_through_a_link_nor_waits_on_a_fifo(tmp_path: Path) -> None:
    """A directory cache others can write in (a lab's, one inside a shared home): a link put
    in place of a narinfo (to a file of the user's) is neither read nor counted as there,
    so a push writes the narinfo again; a fifo is an error at once, for a read, an open and
    the cache's description, never a wait."""
    cache = tmp_path / "cache"
    cache.mkdir()
    backend = open_backend(str(cache))
    secret = tmp_path / "secret.toml"
    secret.write_text("SECRET-TOKEN-abc123\n")
    linked, piped = narinfo_key("0" * 32 + "-linked"), narinfo_key("1" * 32 + "-piped")
    (cache / linked).symlink_to(secret)
    os.mkfifo(cache / piped)
    os.mkfifo(cache / "harness-cache-info")
    assert not backend.exists(linked) and not backend.exists(piped)
    assert list(backend.list()) == []
    for key in (linked, piped, "harness-cache-info"):
        with pytest.raises(CacheError) as refused:
            backend.read_bytes(key)
        assert "SECRET" not in str(refused.value)
        with pytest.raises(CacheError):
            backend.open(key)
    backend.put_bytes(linked, b"StorePath: x\n")
    assert backend.read_bytes(linked) == b"StorePath: x\n" and secret.read_text() == "SECRET-TOKEN-abc123\n"


# --------------------------------------------------------------- export and import


def test_export_import_round_trip(homes, tmp_path: Path, harness_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    secret, public = write_key_pair("airgap-1", tmp_path / "keys")
    tar = tmp_path / "closure.tar"
    out = harness_cli(
        "--home",
        str(home_a),
        "store",
        "export",
        closure.env,
        closure.view,
        closure.wheel,
        "-o",
        str(tar),
        "--key",
        str(secret),
    )
    assert out.code == 0, out.err
    with tarfile.open(tar) as archive:
        names = archive.getnames()
    assert "harness-cache-info" in names and all(narinfo_key(n) in names for n in closure.every)
    # Each narinfo comes after its archive and after its references' narinfos.
    for name in closure.every:
        info = NarInfo.parse(tarfile.open(tar).extractfile(narinfo_key(name)).read().decode(), name)  # type: ignore[union-attr]
        assert names.index(info.url) < names.index(narinfo_key(name))
        assert all(names.index(narinfo_key(r)) < names.index(narinfo_key(name)) for r in info.references)

    out = harness_cli("--home", str(home_b), "store", "import", str(tar), "--trusted-key", public.read_text().strip())
    assert out.code == 0, out.err
    assert {r.name for r in Store.in_home(home_b).records()} == set(closure.every)
    assert harness_cli("--home", str(home_b), "store", "verify", "--check-contents").code == 0
    assert _run_from(Store.in_home(home_b), closure).startswith("python at ")


def test_import_refuses_a_tar_with_a_device_file_or_climbing_name(
    tmp_path: Path,
    harness_cli,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for member, message in (
        (tarfile.TarInfo("nar/dev"), "device file"),
        (tarfile.TarInfo("../escape.narinfo"), "absolute or climbing"),
    ):
        if member.name == "nar/dev":
            member.type = tarfile.CHRTYPE
        tar = tmp_path / "bad.tar"
        with tarfile.open(tar, "w") as archive:
            info = tarfile.TarInfo("harness-cache-info")
            data = b"Format: harness-cache-1\n"
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
            archive.addfile(member, io.BytesIO(b"") if member.isfile() else None)
        out = harness_cli("--home", str(tmp_path / "home"), "store", "import", str(tar))
        assert out.code != 0 and message in out.err, out.err
        _assert_untouched(Store.in_home(tmp_path / "home"))


# -------------------------------------------------------------------- substitute API


def test_substitute_uses_priorities_skips_bad_caches_and_raises_only_for_config(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home_a, home_b = homes
    a = Store.in_home(home_a)
    closure = populate(a)
    untrusted, good = tmp_path / "untrusted", tmp_path / "good"
    push(a, closure.roots, open_backend(str(untrusted)), secret=OTHER_KEY, cache_dir=home_a / "cache")
    push(a, closure.roots, open_backend(str(good)), secret=KEY, cache_dir=home_a / "cache")
    b = Store.in_home(home_b)
    lines: list[str] = []
    nobody = _name("environment", "never-pushed-env", {})
    got = substitute(
        b,
        [closure.env, closure.view, nobody],
        substituters=[
            f"file://{good}?priority=30",
            "http://127.0.0.1:9/nothing-listens",
            f"file://{untrusted}?priority=10",
        ],
        trusted_keys=TRUSTED,
        expected=closure.expected,
        cache_dir=home_b / "cache",
        jobs=4,
        warn=lines.append,
    )
    # References first. The untrusted cache is asked first (priority 10): its fixed-output
    # paths are trusted by the lock's hashes, its built paths are not, so those come from
    # the good cache.
    assert set(got) == set(closure.every) - {closure.wheel}
    assert got.index(closure.python) < got.index(closure.env) and got.index(closure.weights) < got.index(closure.view)
    origin = {n: b.record(n).obtained for n in got}  # type: ignore[union-attr]
    assert all(str(good) in origin[n] for n in (closure.env, closure.python, closure.view))
    assert all(str(untrusted) in origin[n] for n in (closure.source, closure.weights))
    assert any("nothing-listens" in line for line in lines)  # the unreachable cache: a warning
    assert not any(nobody in line for line in lines)  # a path nobody has: quietly left to realize
    assert (
        substitute(
            b, [closure.env], substituters=[str(good)], trusted_keys=TRUSTED, expected={}, cache_dir=home_b / "cache"
        )
        == []
    )  # already registered

    with pytest.raises(CacheConfigError, match="unknown scheme"):
        substitute(
            b, [nobody], substituters=["ftp://example.invalid/cache"], trusted_keys=[], expected={}, cache_dir=tmp_path
        )
    with pytest.raises(CacheConfigError, match="unknown option"):
        substitute(
            b, [nobody], substituters=[f"file://{good}?prio=1"], trusted_keys=[], expected={}, cache_dir=tmp_path
        )
    with pytest.raises(CacheConfigError, match="base64|32 bytes"):
        substitute(
            b, [nobody], substituters=[str(good)], trusted_keys=["lab:not-base64!"], expected={}, cache_dir=tmp_path
        )


def test_narinfo_round_trip_and_strictness() -> None:
    info = NarInfo(
        store_path=BAD,
        kind="environment",
        url=archive_key("blake3:" + "a" * 64),
        file_hash="blake3:" + "a" * 64,
        file_size=10,
        content="blake3:" + "b" * 64,
        nar_size=96,
        references=(SIBLING,),
        impure="host: /usr/bin/python3",
        obtained="uv 0.13.9",
    )
    signed = info.with_signatures([KEY.sign(info)])
    assert NarInfo.parse(signed.render(), "x") == signed
    assert (
        signed.fingerprint()
        == (f"harness-1;{BAD};blake3:{'b' * 64};96;{SIBLING};environment;host: /usr/bin/python3").encode()
    )
    for edit, message in (("NarSize: 96", "NarSize: 96\nNarSize: 97"), ("Kind: environment", "Kind: spaceship")):
        with pytest.raises(CacheError):
            NarInfo.parse(signed.render().replace(edit, message), "x")
    sig = signed.signatures[0].split(":", 1)[1]
    assert len(base64.b64decode(sig)) == 64


# ---------------------------------------------------- a real environment, two homes


@pytest.mark.skipif(sys.platform != "linux", reason="host interpreter copies are Linux-only")
def test_real_interpreter_and_environment_run_from_another_home(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A host interpreter copy and a uv-built venv, pushed from A and pulled into B, run in B."""
    import platform

    from harness.realize.environment import build_environment
    from harness.realize.interpreter import build_interpreter
    from harness.errors import HarnessError
    from harness.lock.document import LockedInterpreter
    from harness.resolve.interpreter import host_platform
    from tests.localindex import wheel_bytes

    home_a, home_b = homes
    a = Store.in_home(home_a)
    version = platform.python_version()
    python = _name("python", f"cpython-{version}-host", {"real": True})
    wheel_file = "alpha-1.0-py3-none-any.whl"
    wheel = _name("file", wheel_file, {"real": True})
    env = _name("environment", "real-env", {"python": python, "wheel": wheel})
    locked = LockedInterpreter(implementation="cpython", version=version, platform=host_platform(), source="host")
    built: dict[str, str] = {}

    def build_python(out: Path) -> BuildResult:
        out.mkdir()
        try:
            result = build_interpreter(locked, out, cache_dir=home_a / "cache" / "uv", offline=True)
        except HarnessError as exc:
            pytest.skip(f"no host CPython {version} to copy: {exc}")
        built["exe"] = result.executable
        return BuildResult(obtained=result.source, impure=result.source if result.is_host else None)

    def build_wheel(out: Path) -> BuildResult:
        out.mkdir()
        (out / wheel_file).write_bytes(wheel_bytes("alpha", "1.0"))
        return BuildResult()

    a.add(python, "python", build_python)
    a.add(wheel, "file", build_wheel)

    def build_env(out: Path) -> BuildResult:
        out.mkdir()
        build_environment(
            out,
            interpreter_dir=a.root / python,
            interpreter_exe=built["exe"],
            wheels=[a.root / wheel / wheel_file],
            cache_dir=home_a / "cache" / "uv",
            interpreter_store_name=python,
        )
        return BuildResult(obtained="uv")

    a.add(env, "environment", build_env, references=(python,))
    cache = tmp_path / "cache"
    push(a, [env], open_backend(str(cache)), secret=KEY, cache_dir=home_a / "cache")
    b = Store.in_home(home_b)
    pulled = _pull(b, [str(cache)], [env], cache_dir=home_b / "cache")
    assert pulled.failed == {} and pulled.registered == [python, env]
    assert all(f.status == "ok" for f in verify_store(b, check_contents=True))
    shutil.rmtree(home_a / "cache", ignore_errors=True)
    probe = "import sys, alpha; print(sys.prefix); print(sys.base_prefix); print(alpha.__file__)"
    proc = subprocess.run(
        [str(b.root / env / "bin" / "python"), "-c", probe],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert proc.returncode == 0, proc.stderr
    prefix, base, module = proc.stdout.split()
    assert os.path.realpath(prefix) == str((b.root / env).resolve())
    assert os.path.realpath(base) == str((b.root / python).resolve())
    assert str(b.root.resolve()) in os.path.realpath(module)


# ------------------------------------------------------------------ the specification


def test_spec_examples_match_the_implementation() -> None:
    """store/README.md's narinfo, fingerprint and example key agree with harness/cache."""
    from harness.cache.signing import parse_public, parse_secret, signed_by_trusted

    spec = (Path(__file__).resolve().parent.parent / "store" / "README.md").read_text()
    blocks = dict(re.findall(r"^```(narinfo|fingerprint|example-key)\n(.*?)^```$", spec, re.S | re.M))
    info = NarInfo.parse(blocks["narinfo"], "store/README.md")
    assert info.render() == blocks["narinfo"]
    assert info.fingerprint().decode() == blocks["fingerprint"].strip()
    keys = dict(line.split(": ", 1) for line in blocks["example-key"].splitlines())
    secret, public = parse_secret(keys["secret"], "spec"), parse_public(keys["public"])
    assert secret.public().render() == public.render()
    assert info.signatures == (secret.sign(info),)  # ed25519 signatures are deterministic
    assert signed_by_trusted(info, parse_trusted([keys["public"]])) == "example-1"


def test_reference_cycle_in_cache_metadata_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    publish(cache, BAD, _nar(_dir(("a", _file()))), refs=(SIBLING,))
    publish(cache, SIBLING, _nar(_dir(("b", _file()))), kind="python", refs=(BAD,))
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], [BAD], cache_dir=tmp_path / "dl")
    assert "cycle" in pulled.failed[BAD] and pulled.registered == []
    _assert_untouched(b)


def test_a_host_interpreter_never_travels_under_a_locks_own_name(homes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A host copy under an interpreter's canonical name (what an older harness registered) is
    neither pushed nor pulled, even signed; under its own ``…-host`` name it travels."""
    nar = _nar(_dir(("bin", _dir(("python3.11", _file(b"#!/bin/sh\n", executable=True))))))
    canonical = _name("python", "cpython-3.11.7", {"legacy": True})
    own = _name("python", "cpython-3.11.7-host", {"legacy": True})
    cache = tmp_path / "cache"
    for name in (canonical, own):
        publish(cache, name, nar, kind="python", impure="host: /usr/bin/python3.11")
    b = Store(tmp_path / "b" / "store")
    pulled = _pull(b, [str(cache)], [canonical, own], cache_dir=tmp_path / "dl")
    assert pulled.registered == [own]
    assert (
        "a host interpreter (host: /usr/bin/python3.11) under the name of a lock's own interpreter"
        in pulled.failed[canonical]
    )
    assert b.record(own).impure == "host: /usr/bin/python3.11"  # type: ignore[union-attr]

    home_a, _ = homes
    a = Store.in_home(home_a)

    def build(out: Path) -> BuildResult:
        (out / "bin").mkdir(parents=True)
        (out / "bin" / "python3.11").write_text("#!/bin/sh\n")
        return BuildResult(obtained="host: /usr/bin/python3.11", impure="host: /usr/bin/python3.11")

    a.add(canonical, "python", build)
    with pytest.raises(CacheError, match=rf"{canonical}: a host interpreter .* not pushing it"):
        push(a, [canonical], open_backend(str(tmp_path / "out")), secret=KEY, cache_dir=home_a / "cache")
