"""Where a binary cache's files live: a directory, S3-compatible storage, HTTP(S), a tar.

One small interface, :class:`Backend`, with keys relative to the cache's root
(``harness-cache-info``, ``<hash>.narinfo``, ``nar/<hex>.nar.zst``):

* ``read_bytes(key)`` — a small file's bytes, or None when the cache has no such key;
* ``open(key, start)`` — a stream of a file from byte ``start`` (a ranged GET, for resumed
  downloads), and the offset it really starts at (0 when the server ignored the range);
* ``exists(key)``; ``list(prefix)``: the keys at the cache's top level starting with
  ``prefix`` (how ``--all`` and import find every ``*.narinfo``);
* ``put_bytes(key, data)`` / ``put_file(key, path, progress)`` — atomic publication: a reader
  sees the whole file or nothing;
* ``local`` — True when ``open`` reads a local file (a directory, a tar): archives are then
  unpacked in place, without a download copy; ``local_path(key)`` names that file where
  there is one.

Unreachable caches and failed transfers raise :class:`~harness.cache.format.CacheError`;
bad URLs raise :class:`~harness.cache.format.CacheConfigError`. Every key is checked
against :data:`KEY` before use, so nothing read from a cache can name a file outside it.

URLs: a plain path or ``file://`` (a directory: local disk, NFS), ``s3://bucket/prefix``
(query parameters ``endpoint``, ``region``, ``profile``, ``multipart-threshold``; without
``endpoint`` boto3's own settings apply, ``AWS_ENDPOINT_URL`` among them; credentials from
the standard AWS chain), ``http://`` and ``https://`` (read-only). Any URL may carry
``priority=N`` (lower is asked first), which overrides the cache's own ``Priority``.
"""

from __future__ import annotations

import http.client
import os
import re
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit, urlunsplit

from harness.cache.format import CacheConfigError, CacheError
from harness.store.entries import is_regular, open_regular

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from botocore.response import StreamingBody

Progress = Callable[[int], None]

KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
#: S3 uploads at least this large go in parts (boto3's transfer manager, in parallel).
MULTIPART_THRESHOLD = 64 << 20
TIMEOUT_S = 60.0


def _ignore(_n: int) -> None:
    pass


def check_key(key: str) -> str:
    if not KEY.match(key) or ".." in key:
        raise CacheError(f"refusing cache key {key!r}: not a plain name inside the cache")
    return key


class ByteStream(Protocol):
    """What a backend's :meth:`Backend.open` returns: bytes read in chunks, closed by ``with``."""

    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

    def __enter__(self) -> ByteStream: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None: ...


class Backend(Protocol):
    """The storage under one cache (module docstring)."""

    url: str
    writable: bool
    local: bool

    def read_bytes(self, key: str) -> bytes | None: ...

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> Iterator[str]: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None: ...

    def local_path(self, key: str) -> Path | None: ...

    def staging_dir(self) -> Path | None: ...


@runtime_checkable
class Deletable(Protocol):
    """A backend that can take a key back (directories, S3; not HTTP, not a tar being written)."""

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class CacheUrl:
    """A parsed cache URL: the backend's address and the options that came with it."""

    url: str  # as given, for messages (credentials never appear in cache URLs)
    scheme: str  # "file", "s3", "http", "https"
    location: str  # a directory, "bucket/prefix", or the http(s) base URL
    options: dict[str, str]

    @property
    def priority(self) -> int | None:
        value = self.options.get("priority")
        if value is None:
            return None
        if not value.isdigit():
            raise CacheConfigError(f"cache {self.url}: priority={value!r} is not a non-negative integer")
        return int(value)


def parse_url(url: str) -> CacheUrl:
    """Parse a cache URL; an unknown scheme or option is a :class:`CacheConfigError`."""
    if "://" not in url:
        return CacheUrl(url, "file", str(Path(url).expanduser()), {})
    parts = urlsplit(url)
    options = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    known = {
        "file": {"priority"},
        "s3": {"priority", "endpoint", "region", "profile", "multipart-threshold"},
        "http": {"priority"},
        "https": {"priority"},
    }
    if parts.scheme not in known:
        raise CacheConfigError(
            f"cache {url!r}: unknown scheme {parts.scheme!r}; use a directory, file://, s3:// or http(s)://"
        )
    unknown = sorted(set(options) - known[parts.scheme])
    if unknown:
        raise CacheConfigError(
            f"cache {url!r}: unknown option {unknown[0]!r}; known: {', '.join(sorted(known[parts.scheme]))}"
        )
    if parts.scheme == "file":
        location = urllib.request.url2pathname(parts.path)
    elif parts.scheme == "s3":
        if not parts.netloc:
            raise CacheConfigError(f"cache {url!r}: s3:// needs a bucket (s3://bucket/prefix)")
        location = parts.netloc + parts.path.rstrip("/")
    else:
        location = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", "", ""))
    return CacheUrl(url, parts.scheme, location, options)


def open_backend(url: str | CacheUrl, *, jobs: int = 8) -> Backend:
    """The backend for ``url`` (see the module docstring); nothing is contacted yet."""
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.scheme == "file":
        return DirectoryBackend(Path(parsed.location), parsed.url)
    if parsed.scheme == "s3":
        return S3Backend(parsed, jobs=jobs)
    return HttpBackend(parsed.location, parsed.url)


# ------------------------------------------------------------------------------ directory


class DirectoryBackend:
    """A cache in a directory (local disk or NFS). Writes are temp-file-then-rename."""

    writable = True
    local = True

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = root
        self.url = url or str(root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    # Every file is opened without following a link and without blocking on a fifo: a cache
    # folder others can write in (a lab's, a shared home's) may hold what another user put
    # there in place of a file. What a cache holds is checked anyway (signatures, hashes);
    # this keeps a planted link from reading one of the user's own files into an error, and
    # a fifo from hanging a push or a pull.

    def read_bytes(self, key: str) -> bytes | None:
        try:
            with open_regular(self._path(key)) as handle:
                return handle.read()
        except FileNotFoundError:
            if not self.root.is_dir():
                raise CacheError(f"cache {self.url}: no such directory") from None
            return None
        except OSError as exc:
            raise CacheError(f"cache {self.url}: cannot read {key}: {exc.strerror or exc}") from None

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]:
        try:
            handle = open_regular(self._path(key))
        except FileNotFoundError:
            raise CacheError(f"cache {self.url} has no {key} (deleted?)") from None
        except OSError as exc:
            raise CacheError(f"cache {self.url}: cannot read {key}: {exc.strerror or exc}") from None
        handle.seek(start)
        return handle, start

    def exists(self, key: str) -> bool:
        return is_regular(self._path(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        if not self.root.is_dir():
            raise CacheError(f"cache {self.url}: no such directory")
        for entry in sorted(self.root.iterdir()):
            if is_regular(entry) and entry.name.startswith(prefix) and KEY.match(entry.name):
                yield entry.name

    def staging_dir(self) -> Path:
        """Archives are compressed straight into the cache, then renamed into place."""
        folder = self.root / "nar"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        size = path.stat().st_size
        if path.parent.resolve() == target.parent.resolve():
            os.chmod(path, 0o644)
            os.replace(path, target)  # staged in the cache itself: publication is a rename
            progress(size)
            return
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    progress(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def delete(self, key: str) -> None:
        """Remove ``key`` if present (a failed push takes back the archives it wrote)."""
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise CacheError(f"cache {self.url}: cannot delete {key}: {exc.strerror or exc}") from None


# ------------------------------------------------------------------------------------- S3


class S3Backend:
    """A cache under ``s3://bucket/prefix`` on any S3-compatible server, through boto3."""

    writable = True
    local = False

    def __init__(self, parsed: CacheUrl, *, jobs: int = 8) -> None:
        self.url = parsed.url
        bucket, _, prefix = parsed.location.partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = parsed.options
        self.jobs = max(1, jobs)
        threshold = parsed.options.get("multipart-threshold")
        if threshold is not None and not threshold.isdigit():
            raise CacheConfigError(f"cache {self.url}: multipart-threshold={threshold!r} is not a byte count")
        self.multipart_threshold = int(threshold) if threshold else MULTIPART_THRESHOLD
        self._client: BaseClient | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> BaseClient:
        """The boto3 S3 client, made on first use."""
        # boto3 is imported and the client made on first use: most commands never touch S3.
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                session = boto3.session.Session(profile_name=self.options.get("profile"))
                # boto3 reads AWS_ENDPOINT_URL(_S3) itself; looking here too lets a custom
                # endpoint from either place get path-style addressing.
                endpoint = (
                    self.options.get("endpoint")
                    or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL")
                    or None
                )
                config = Config(
                    retries={"max_attempts": 5, "mode": "standard"},
                    max_pool_connections=max(10, self.jobs * 2),
                    connect_timeout=TIMEOUT_S,
                    read_timeout=TIMEOUT_S,
                    # A custom endpoint (a lab's MinIO, a loopback server) rarely has
                    # wildcard DNS for virtual-host buckets; path style always works.
                    s3={"addressing_style": "path"} if endpoint else None,
                )
                self._client = session.client(
                    "s3", endpoint_url=endpoint, region_name=self.options.get("region"), config=config
                )
            return self._client

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, key: str, exc: Exception) -> CacheError:
        return CacheError(f"cache {self.url}: {key}: {exc}")

    def read_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return response["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._error(key, exc) from None
        except BotoCoreError as exc:
            raise self._error(key, exc) from None

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, str] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start:
            kwargs["Range"] = f"bytes={start}-"
        try:
            response = self.client.get_object(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidRange" and start:
                return self.open(key, 0)
            if code in ("NoSuchKey", "404"):
                raise CacheError(f"cache {self.url} has no {key} (deleted?)") from None
            raise self._error(key, exc) from None
        except BotoCoreError as exc:
            raise self._error(key, exc) from None
        real = start if start and "ContentRange" in response else 0
        return _BotoStream(response["Body"], self.url, key), real

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._error(key, exc) from None
        except BotoCoreError as exc:
            raise self._error(key, exc) from None

    def list(self, prefix: str = "") -> Iterator[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix, Delimiter="/"
            )
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(base) :]
                    if KEY.match(name):
                        yield name
        except (ClientError, BotoCoreError) as exc:
            raise self._error(prefix or "(list)", exc) from None

    def staging_dir(self) -> Path | None:
        return None

    def put_bytes(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(key, exc) from None

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None:
        """Upload through boto3's transfer manager: parts in parallel above the threshold."""
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        config = TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=max(self.multipart_threshold, 8 << 20),
            max_concurrency=min(10, self.jobs),
            use_threads=True,
        )
        try:
            # S3 makes an object visible only once its upload completes (multipart too).
            self.client.upload_file(str(path), self.bucket, self._key(key), Config=config, Callback=progress)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(key, exc) from None
        except Exception as exc:  # boto3's S3UploadFailedError wraps the ClientError
            if type(exc).__name__ == "S3UploadFailedError":
                raise self._error(key, exc) from None
            raise

    def local_path(self, key: str) -> Path | None:
        return None

    def delete(self, key: str) -> None:
        """Remove ``key`` if present (a failed push takes back the archives it wrote)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(key, exc) from None


class _BotoStream:
    """A botocore StreamingBody whose read errors become CacheError (a cache gone mid-read)."""

    def __init__(self, body: StreamingBody, url: str, key: str) -> None:
        self.body = body
        self.url = url
        self.key = key

    def read(self, n: int = -1) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return self.body.read(None if n < 0 else n)
        except (BotoCoreError, OSError, http.client.HTTPException) as exc:
            raise CacheError(f"cache {self.url}: {self.key}: transfer broke off: {exc}") from None

    def close(self) -> None:
        self.body.close()

    def __enter__(self) -> _BotoStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------- HTTP


class HttpBackend:
    """A read-only cache served over HTTP(S) (any static file server; ranges for resume)."""

    writable = False
    local = False

    def __init__(self, base: str, url: str) -> None:
        self.base = base
        self.url = url

    def _request(self, key: str, *, method: str = "GET", start: int = 0) -> http.client.HTTPResponse | None:
        """The response to ``method`` on ``key`` (from byte ``start``), None when the cache has no such key."""
        request = urllib.request.Request(
            self.base + check_key(key), method=method, headers={"Accept-Encoding": "identity"}
        )
        if start:
            request.add_header("Range", f"bytes={start}-")
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            exc.close()
            # 403 too, as Nix does: S3 buckets served over HTTP answer 403 for a missing key
            # when listing is not allowed.
            if exc.code in (403, 404, 410):
                return None
            if exc.code == 416 and start:
                return self._request(key, method=method)
            raise CacheError(f"cache {self.url}: {key}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CacheError(f"cache {self.url}: cannot reach it: {reason}") from None

    def read_bytes(self, key: str) -> bytes | None:
        response = self._request(key)
        if response is None:
            return None
        with response:
            try:
                return response.read()
            except (http.client.HTTPException, OSError) as exc:
                raise CacheError(f"cache {self.url}: {key}: transfer broke off: {exc}") from None

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]:
        response = self._request(key, start=start)
        if response is None:
            raise CacheError(f"cache {self.url} has no {key} (deleted?)")
        real = 0
        if start and response.status == 206:
            match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
            if match and int(match.group(1)) == start:
                real = start
            else:  # a range we did not ask for: start over
                response.close()
                return self.open(key, 0)
        length = response.headers.get("Content-Length")
        return _HttpStream(response, self.url, key, int(length) if length and length.isdigit() else None), real

    def exists(self, key: str) -> bool:
        response = self._request(key, method="HEAD")
        if response is None:
            return False
        response.close()
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        raise CacheError(f"cache {self.url}: an HTTP cache cannot be listed; name what to pull")

    def staging_dir(self) -> Path | None:
        return None

    def put_bytes(self, key: str, data: bytes) -> None:
        raise CacheError(f"cache {self.url} is read-only (HTTP); push to its directory or S3 bucket")

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None:
        raise CacheError(f"cache {self.url} is read-only (HTTP); push to its directory or S3 bucket")

    def local_path(self, key: str) -> Path | None:
        return None


class _HttpStream:
    """An HTTP response body that raises CacheError when it ends before its length."""

    def __init__(self, response: http.client.HTTPResponse, url: str, key: str, length: int | None) -> None:
        self.response = response
        self.url = url
        self.key = key
        self.left = length

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.response.read(None if n < 0 else n)
        except (http.client.HTTPException, OSError) as exc:
            raise CacheError(f"cache {self.url}: {self.key}: transfer broke off: {exc!r}") from None
        if self.left is not None:
            if not data and self.left > 0:
                # http.client reports a cut connection as a clean end of body; it is not.
                raise CacheError(f"cache {self.url}: {self.key}: transfer broke off {self.left} bytes short")
            self.left -= len(data)
        return data

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> _HttpStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "KEY",
    "MULTIPART_THRESHOLD",
    "Backend",
    "CacheUrl",
    "DirectoryBackend",
    "HttpBackend",
    "S3Backend",
    "check_key",
    "open_backend",
    "parse_url",
]
