"""A real package index for tests: tiny wheels and sdists served over HTTP on 127.0.0.1.

Nothing here is a mock. Wheels are written byte for byte as the wheel spec (PEP 427/491)
says — ``METADATA``, ``WHEEL`` and a ``RECORD`` with hashes — so uv and pip install them.
Sdists carry a pyproject.toml with a tiny in-tree PEP 517 backend (``backend-path``) and no
build requirements, so uv can build them with no network. Archives are deterministic (fixed
timestamps and permissions): the same inputs always give the same bytes and sha256.

The server speaks the simple repository API: PEP 503 HTML (``#sha256=`` fragments) and,
when the client asks for it through ``Accept``, PEP 691 JSON with PEP 700 ``size`` fields.
``LocalIndex(..., json_api=False)`` serves HTML only, like many mirrors and the PyTorch
indexes. Every request path is logged in ``LocalIndex.requests``, and every file request's
``Range`` header (or None) in ``LocalIndex.range_headers``.

Files are served whole (``200``) unless ``ranges=True``, which honours ``Range: bytes=N-``
with ``206``. :meth:`LocalIndex.cut_next` makes the next download of a file stop after some
bytes and drop the connection, as a flaky network does.

Use the ``local_index`` fixture for the standard set of packages (see :func:`publish_standard`),
or build a :class:`LocalIndex` yourself for a second index.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import html
import io
import json
import re
import tarfile
import threading
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest

_EPOCH = (2020, 1, 1, 0, 0, 0)
_MTIME = 1577836800  # 2020-01-01T00:00:00Z


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist(name: str) -> str:
    """The distribution name as it appears in file names (PEP 427 escaping)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata(name: str, version: str, requires: Iterable[str], requires_python: str | None) -> str:
    lines = ["Metadata-Version: 2.3", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {req}" for req in requires]
    return "\n".join(lines) + "\n"


def wheel_bytes(
    name: str,
    version: str,
    *,
    requires: Iterable[str] = (),
    tag: str = "py3-none-any",
    requires_python: str | None = None,
    modules: Mapping[str, str] | None = None,
) -> bytes:
    """The bytes of an installable wheel holding one module ``<name>`` with ``__version__``,
    and ``modules`` (path inside the wheel -> text) besides."""
    module = _dist(name)
    info = f"{module}-{version}.dist-info"
    root_is_purelib = "true" if tag.endswith("-any") else "false"
    files = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n',
        **(modules or {}),
        f"{info}/METADATA": _metadata(name, version, requires, requires_python),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: harness-tests\nRoot-Is-Purelib: {root_is_purelib}\nTag: {tag}\n"
        ),
    }
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, text in files.items():
            entry = zipfile.ZipInfo(path, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, text)
    return buffer.getvalue()


#: A complete PEP 517 backend with no requirements of its own, shipped inside each sdist and
#: source tree. It reads [project] from pyproject.toml (name, version, dependencies) and writes
#: a pure wheel of the package folder named after the project.
#: PEP 660 for the in-tree backend: a wheel whose .pth names the tree absolutely, as
#: hatchling, flit and setuptools' compat mode write it.
BUILD_EDITABLE = r"""

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _, module, stem = _names()
    info = stem + ".dist-info"
    files = {
        "_" + module + ".pth": (os.path.abspath(".") + "\n").encode(),
        info + "/METADATA": _metadata().encode(),
        info + "/WHEEL": b"Wheel-Version: 1.0\nGenerator: harness-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    return _write_wheel(wheel_directory, stem, files)
"""

BACKEND = (
    r'''
"""In-tree PEP 517 backend used by harness's tests (no build requirements)."""
import base64, hashlib, io, os, re, tarfile, zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def _project():
    if tomllib is not None:
        with open("pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]
    text = open("pyproject.toml").read()
    name = re.search(r'^name = "(.*)"', text, re.M).group(1)
    version = re.search(r'^version = "(.*)"', text, re.M).group(1)
    deps = re.findall(r'^    "(.*)",$', text, re.M)
    return {"name": name, "version": version, "dependencies": deps}


def _names():
    project = _project()
    module = re.sub(r"[-_.]+", "_", project["name"]).lower()
    return project, module, f"{module}-{project['version']}"


def _metadata():
    project, _, _ = _names()
    lines = ["Metadata-Version: 2.3", "Name: " + project["name"], "Version: " + project["version"]]
    lines += ["Requires-Dist: " + d for d in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _, _, stem = _names()
    info = os.path.join(metadata_directory, stem + ".dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata())
    return stem + ".dist-info"


def _write_wheel(wheel_directory, stem, files):
    """A pure wheel of ``files`` (path -> bytes) with its RECORD; deterministic bytes."""
    info = stem + ".dist-info"
    record = []
    for p, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{p},sha256={digest},{len(data)}")
    record.append(info + "/RECORD,,")
    files[info + "/RECORD"] = ("\n".join(record) + "\n").encode()
    name = stem + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, data in files.items():
            z.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _, module, stem = _names()
    files = {}
    for dirpath, _, names in sorted(os.walk(module)):
        for n in sorted(names):
            if n.endswith(".py"):
                p = os.path.join(dirpath, n)
                files[p.replace(os.sep, "/")] = open(p, "rb").read()
    info = stem + ".dist-info"
    files[info + "/METADATA"] = _metadata().encode()
    files[info + "/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: harness-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return _write_wheel(wheel_directory, stem, files)


def build_sdist(sdist_directory, config_settings=None):
    _, _, stem = _names()
    name = stem + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for dirpath, _, names in sorted(os.walk(".")):
            for n in sorted(names):
                p = os.path.join(dirpath, n)
                t.add(p, arcname=stem + "/" + os.path.relpath(p, "."))
    return name
'''
    + BUILD_EDITABLE
)


def pyproject_text(name: str, version: str, requires: Iterable[str] = ()) -> str:
    """A static pyproject.toml using the in-tree :data:`BACKEND`."""
    deps = "".join(f'    "{req}",\n' for req in requires)
    return (
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [\n{deps}]\n'
    )


def write_source_tree(directory: Path, name: str, version: str, requires: Iterable[str] = ()) -> Path:
    """A buildable project folder (pyproject.toml, in-tree backend, one module); returns it."""
    requires = list(requires)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(pyproject_text(name, version, requires))
    (directory / "backend.py").write_text(BACKEND)
    module = directory / _dist(name)
    module.mkdir(exist_ok=True)
    (module / "__init__.py").write_text(f'__version__ = "{version}"\n')
    return directory


def sdist_bytes(name: str, version: str, *, requires: Iterable[str] = (), backend: str = BACKEND) -> bytes:
    """The bytes of a deterministic ``.tar.gz`` sdist (PKG-INFO, pyproject.toml, backend, module);
    ``backend``: the in-tree build backend's source (:data:`BACKEND`, or one built on it)."""
    requires = list(requires)
    stem = f"{_dist(name)}-{version}"
    members = {
        "PKG-INFO": _metadata(name, version, requires, None),
        "pyproject.toml": pyproject_text(name, version, requires),
        "backend.py": backend,
        f"{_dist(name)}/__init__.py": f'__version__ = "{version}"\n',
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{stem}/{path}")
            info.size, info.mtime, info.mode = len(data), _MTIME, 0o644
            archive.addfile(info, io.BytesIO(data))
    out = io.BytesIO()

    with gzip.GzipFile(fileobj=out, mode="wb", mtime=_MTIME) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


@dataclass
class LocalIndex:
    """A simple-API index over the files in ``root``, served on 127.0.0.1 once started.

    ``url`` is the index address (``http://127.0.0.1:PORT/simple``); files live under
    ``/files/``. Use as a context manager or call :meth:`start`/:meth:`stop`.
    """

    root: Path
    json_api: bool = True
    ranges: bool = False
    requests: list[str] = field(default_factory=list)
    #: (file name, the request's Range header or None) per file request, in order.
    range_headers: list[tuple[str, str | None]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _cuts: dict[str, list[int]] = field(default_factory=dict)
    _cut_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    # --- publishing ---------------------------------------------------------------------
    def add_wheel(
        self,
        name: str,
        version: str,
        *,
        requires: Iterable[str] = (),
        tag: str = "py3-none-any",
        requires_python: str | None = None,
        modules: Mapping[str, str] | None = None,
    ) -> Path:
        """Write a wheel into the index (``modules``: more files in it); returns its path."""
        path = self.root / f"{_dist(name)}-{version}-{tag}.whl"
        path.write_bytes(
            wheel_bytes(name, version, requires=requires, tag=tag, requires_python=requires_python, modules=modules)
        )
        return path

    def add_sdist(self, name: str, version: str, *, requires: Iterable[str] = (), backend: str = BACKEND) -> Path:
        """Write an sdist into the index (``backend``: as for :func:`sdist_bytes`); returns its path."""
        path = self.root / f"{_dist(name)}-{version}.tar.gz"
        path.write_bytes(sdist_bytes(name, version, requires=requires, backend=backend))
        return path

    def add_variants_json(self, name: str, version: str, variants: Mapping[str, object]) -> Path:
        """Serve ``{name}-{version}-variants.json`` (WheelNext, PEP 825) beside the release's
        wheels, linked from the project's page: ``variants`` maps each label to its properties,
        ``{namespace: {feature: [values]}}``; the NVIDIA provider is its one namespace."""
        document = {
            "default-priorities": {"namespace": ["nvidia"]},
            "providers": {"nvidia": {"requires": ["nvidia-variant-provider"], "plugin-api": "nvidia_provider:Plugin"}},
            "variants": variants,
        }
        path = self.root / f"{_dist(name)}-{version}-variants.json"
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return path

    def cut_next(self, filename: str, *, after: int) -> None:
        """Make the next GET of ``filename`` send only ``after`` body bytes, then close.

        The announced ``Content-Length`` stays the full length, so the client sees a short
        body. Calls queue up: each cuts one more download.
        """
        with self._cut_lock:
            self._cuts.setdefault(filename, []).append(after)

    def _take_cut(self, filename: str) -> int | None:
        with self._cut_lock:
            queue = self._cuts.get(filename)
            return queue.pop(0) if queue else None

    def file(self, filename: str) -> Path:
        """The path of a published file."""
        return self.root / filename

    def projects(self) -> dict[str, list[Path]]:
        """Published files grouped by normalized project name."""
        out: dict[str, list[Path]] = {}
        for path in sorted(self.root.iterdir()):
            if path.suffix == ".whl" or path.name.endswith((".tar.gz", "-variants.json")):
                stem = path.name.removesuffix(".tar.gz") if path.name.endswith(".tar.gz") else path.name
                out.setdefault(normalize(stem.split("-", 1)[0]), []).append(path)
        return out

    # --- serving ------------------------------------------------------------------------
    @property
    def base(self) -> str:
        if self._server is None:
            raise RuntimeError("index not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The index address to configure (no trailing slash)."""
        return f"{self.base}/simple"

    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"index": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll interval keeps stop() (once per test) fast.
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    index: LocalIndex

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def do_GET(self) -> None:
        self._respond(head=False)

    def _respond(self, *, head: bool) -> None:
        index = self.index
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        index.requests.append(path)
        wants_json = index.json_api and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
        if path.startswith("/files/"):
            name = path.removeprefix("/files/")
            target = index.root / name
            if target.parent != index.root or not target.is_file():
                return self._send(404, b"not found", "text/plain", head)
            index.range_headers.append((name, self.headers.get("Range")))
            data = target.read_bytes()
            cut = None if head else index._take_cut(name)
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")) if index.ranges else None
            if match and int(match.group(1)) < len(data):
                start = int(match.group(1))
                extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                return self._send(206, data[start:], "application/octet-stream", head, cut=cut, extra=extra)
            return self._send(200, data, "application/octet-stream", head, cut=cut)
        projects = index.projects()
        if path in ("/simple", "/simple/"):
            if wants_json:
                body = {"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in projects]}
                return self._send(200, json.dumps(body).encode(), "application/vnd.pypi.simple.v1+json", head)
            links = "".join(f'<a href="/simple/{n}/">{n}</a>\n' for n in projects)
            return self._send(200, _page(links), "text/html", head)
        match = re.fullmatch(r"/simple/([^/]+)/?", path)
        if not match or normalize(match.group(1)) not in projects:
            return self._send(404, b"not found", "text/plain", head)
        name = normalize(match.group(1))
        files = [(p.name, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size) for p in projects[name]]
        if wants_json:
            body = {
                "meta": {"api-version": "1.1"},
                "name": name,
                "versions": [],
                "files": [
                    {"filename": f, "url": f"/files/{f}", "hashes": {"sha256": h}, "size": s} for f, h, s in files
                ],
            }
            return self._send(200, json.dumps(body).encode(), "application/vnd.pypi.simple.v1+json", head)
        links = "".join(f'<a href="/files/{html.escape(f)}#sha256={h}">{html.escape(f)}</a>\n' for f, h, _ in files)
        return self._send(200, _page(links), "text/html", head)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str,
        head: bool,
        *,
        cut: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            return
        try:
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True  # the client sees a short body and a closed socket
                return
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-transfer (a test cancelling a download)


def _page(links: str) -> bytes:
    return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()


def publish_standard(index: LocalIndex) -> LocalIndex:
    """The standard test set.

    * ``alpha`` 1.0 and 2.0 — two versions of one pure package;
    * ``beta`` 1.0 — depends on ``alpha>=1.0``;
    * ``gamma`` 1.0 — needs ``beta`` and ``epsilon`` (a small dependency graph);
    * ``delta`` 1.0 — a pure wheel plus platform wheels for manylinux x86_64 and Windows;
    * ``winonly`` 1.0 — only a Windows wheel (cp311, win_amd64);
    * ``epsilon`` 1.0 — only an sdist, built by its in-tree backend.
    """
    index.add_wheel("alpha", "1.0")
    index.add_wheel("alpha", "2.0")
    index.add_wheel("beta", "1.0", requires=["alpha>=1.0"])
    index.add_wheel("gamma", "1.0", requires=["beta", "epsilon"])
    index.add_wheel("delta", "1.0")
    index.add_wheel("delta", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    index.add_wheel("delta", "1.0", tag="cp311-cp311-win_amd64")
    index.add_wheel("winonly", "1.0", tag="cp311-cp311-win_amd64")
    index.add_sdist("epsilon", "1.0")
    return index


@pytest.fixture
def local_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    """A started :class:`LocalIndex` holding :func:`publish_standard`'s packages."""
    index = publish_standard(LocalIndex(tmp_path_factory.mktemp("index")))
    with index:
        yield index
