"""A real Debian archive for tests: .deb files built here, a Packages index, served over HTTP.

Packages are built with ``dpkg-deb --build`` (``--root-owner-group``, ``SOURCE_DATE_EPOCH``
fixed: the same inputs give the same bytes); :func:`raw_deb` writes a ``.deb`` byte by byte
(``ar`` of ``debian-binary``, ``control.tar.gz``, ``data.tar.gz``) for the members no
``dpkg-deb`` would accept (``..``, absolute paths). :meth:`DebArchive.publish` writes
``dists/<suite>/main/binary-<arch>/Packages.gz`` as an archive has it; the server is a plain
``http.server`` on 127.0.0.1 that logs every path it served.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MTIME = 1577836800


@dataclass
class DebArchive:
    root: Path
    suite: str = "bookworm"
    arch: str = "amd64"
    stanzas: dict[str, str] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def add(
        self,
        name: str,
        version: str,
        files: dict[str, bytes | str],
        *,
        depends: str = "",
        links: dict[str, str] | None = None,
        postinst: str | None = None,
        executable: tuple[str, ...] = (),
    ) -> Path:
        """Build ``name_version_arch.deb`` with ``dpkg-deb`` into the pool; ``files`` maps paths
        (``usr/bin/x``) to contents, ``links`` paths to symlink targets."""
        tree = self.root / "build" / f"{name}-{version}"
        if tree.exists():
            shutil.rmtree(tree)
        (tree / "DEBIAN").mkdir(parents=True)
        control = f"Package: {name}\nVersion: {version}\nArchitecture: {self.arch}\nMaintainer: t <t@localhost>\n"
        control += f"Description: test package {name}\n" + (f"Depends: {depends}\n" if depends else "")
        (tree / "DEBIAN" / "control").write_text(control)
        if postinst is not None:
            (tree / "DEBIAN" / "postinst").write_text(postinst)
            os.chmod(tree / "DEBIAN" / "postinst", 0o755)
        for path, body in files.items():
            dest = tree / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(body.encode() if isinstance(body, str) else body)
            os.chmod(dest, 0o755 if path in executable else 0o644)
        for path, target in (links or {}).items():
            dest = tree / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, dest)
        deb = self.pool / f"{name}_{version}_{self.arch}.deb"
        deb.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(MTIME)}
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)],
            check=True,
            capture_output=True,
            env=env,
        )
        self._stanza(name, version, deb, depends)
        return deb

    def add_raw(self, name: str, version: str, members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
        deb = self.pool / f"{name}_{version}_{self.arch}.deb"
        deb.parent.mkdir(parents=True, exist_ok=True)
        deb.write_bytes(raw_deb(name, version, self.arch, members))
        self._stanza(name, version, deb, "")
        return deb

    @property
    def pool(self) -> Path:
        return self.root / "pool" / "main"

    def _stanza(self, name: str, version: str, deb: Path, depends: str) -> None:
        data = deb.read_bytes()
        lines = [f"Package: {name}", f"Version: {version}", f"Architecture: {self.arch}"]
        lines += [f"Depends: {depends}"] if depends else []
        lines += [
            f"Filename: {deb.relative_to(self.root).as_posix()}",
            f"Size: {len(data)}",
            f"SHA256: {hashlib.sha256(data).hexdigest()}",
            f"Description: test package {name}",
        ]
        self.stanzas[name] = "\n".join(lines) + "\n"

    def publish(self) -> None:
        folder = self.root / "dists" / self.suite / "main" / f"binary-{self.arch}"
        folder.mkdir(parents=True, exist_ok=True)
        text = "\n".join(self.stanzas[n] for n in sorted(self.stanzas))
        (folder / "Packages.gz").write_bytes(gzip.compress(text.encode(), mtime=0))

    def serve(self) -> str:
        archive = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(archive.root), **kwargs)  # type: ignore[arg-type]

            def log_message(self, format: str, *args: object) -> None:
                archive.requests.append(self.path)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _tar(members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            info, body = member if isinstance(member, tuple) else (member, b"")
            info.mtime = MTIME
            info.size = len(body) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(body) if info.isfile() else None)
    return buffer.getvalue()


def raw_deb(
    name: str, version: str, arch: str, members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]
) -> bytes:
    """A ``.deb`` written byte by byte, whose data.tar holds exactly ``members``."""
    control = tarfile.TarInfo("./control")
    text = f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: t <t@localhost>\nDescription: x\n"
    parts = [
        ("debian-binary", b"2.0\n"),
        ("control.tar.gz", _tar([(control, text.encode())])),
        ("data.tar.gz", _tar(members)),
    ]
    out = b"!<arch>\n"
    for member, body in parts:
        header = f"{member:<16}{MTIME:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode()
        out += header + body + (b"\n" if len(body) % 2 else b"")
    return out


def file_member(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


def link_member(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def dir_member(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info
