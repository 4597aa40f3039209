"""A local stand-in for uv's interpreter downloads: an archive in python-build-standalone's
``install_only`` layout, served over HTTP, and a download list naming it by URL and sha256.

uv installs a "uv-managed" CPython from a download list (built into uv; replaced with
``--python-downloads-json-url`` / ``UV_PYTHON_DOWNLOADS_JSON_URL``). Each entry of the list is
keyed ``cpython-<X.Y.Z>-<os>-<arch>-<libc>`` and holds (uv 0.13's ``JsonPythonDownload``):
``name``, ``arch`` (``{"family": …, "variant": null}``), ``os``, ``libc``, ``major``,
``minor``, ``patch``, ``prerelease``, ``url``, ``sha256``, ``variant`` and ``build``. The
archive holds one top folder ``python/`` with ``bin/``, ``lib/`` and ``include/``, built with
the prefix ``/install`` (which uv rewrites in ``_sysconfigdata`` to where it installs).

The archive is made from a relocatable copy of this machine's CPython (harness's own host
copy), with the copy's build prefix put back to ``/install`` as python-build-standalone
ships it. uv then installs it exactly as it installs a real download: fetched, checked
against the sha256, unpacked, patched.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import platform
import shutil
import stat
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.errors import HarnessError
from harness.lock.document import LockedInterpreter
from harness.realize.interpreter import InterpreterBuild, build_host_copy
from harness.resolve.interpreter import host_platform


def writable(root: Path) -> None:
    """Make every folder under ``root`` writable again (store paths are read-only)."""
    for folder, _, _ in os.walk(root):
        Path(folder).chmod(Path(folder).stat().st_mode | stat.S_IWUSR)


def install_only_archive(copy: Path, build: InterpreterBuild, folder: Path) -> Path:
    """``folder/cpython-<version>-install_only.tar.gz`` from the relocatable interpreter at
    ``copy`` (made by harness's host copy, ``build``): ``python/`` at the root, ``/install``
    as the build prefix in sysconfig, no bytecode (uv's archives ship none either way)."""
    staging = folder / "staging" / "python"
    shutil.copytree(copy, staging, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    writable(staging)
    host_prefix = os.path.dirname(os.path.dirname(build.source.removeprefix("host: ")))
    for data in staging.glob("lib/python*/_sysconfigdata_*.py"):
        text = data.read_text().split("\n\n# Added by harness")[0]
        data.unlink()  # read-only, as in the store: only root could write it in place
        data.write_text(text.replace(host_prefix, "/install"))
    archive = folder / f"cpython-{build.version}-install_only.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(staging, arcname="python")
    shutil.rmtree(staging.parent)
    return archive


def host_archive(version: str, folder: Path) -> Path:
    """An ``install_only`` archive of this machine's CPython ``version`` (HarnessError when it
    has none: callers skip)."""
    copy = folder / "copy"
    copy.mkdir(parents=True)
    locked = LockedInterpreter(implementation="cpython", version=version, platform=host_platform(), source="host")
    build = build_host_copy(locked, copy)
    if build.version != version:  # another release of the series: not the archive asked for
        raise HarnessError(f"no installed CPython {version} here to repackage (only {build.version})")
    archive = install_only_archive(copy, build, folder)
    writable(copy)
    shutil.rmtree(copy)
    return archive


def download_list(archive: Path, url: str, version: str, folder: Path) -> Path:
    """A download list (uv's JSON format, module doc) naming ``archive`` at ``url``."""
    major, minor, patch = (int(x) for x in version.split("."))
    arch = platform.machine()
    listing = folder / "downloads.json"
    listing.write_text(
        json.dumps(
            {
                f"cpython-{version}-linux-{arch}-gnu": {
                    "name": "cpython",
                    "arch": {"family": arch, "variant": None},
                    "os": "linux",
                    "libc": "gnu",
                    "major": major,
                    "minor": minor,
                    "patch": patch,
                    "prerelease": "",
                    "variant": None,
                    "build": "test",
                    "url": url,
                    "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
                }
            },
            indent=1,
        )
    )
    return listing


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` over HTTP on loopback; yields the base URL (no trailing slash)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=os.fspath(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def python_downloads(version: str, folder: Path) -> Iterator[str]:
    """A served download list offering CPython ``version`` (this machine's, repackaged);
    yields the list's URL, for ``HARNESS_PYTHON_DOWNLOADS_JSON_URL``."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = host_archive(version, folder)
    with serve(folder) as base:
        download_list(archive, f"{base}/{archive.name}", version, folder)
        yield f"{base}/downloads.json"
