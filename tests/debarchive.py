"""A real Debian archive for tests: .deb files built here, a Packages index, served over HTTP.

Packages are built with ``dpkg-deb --build`` (``--root-owner-group``, ``SOURCE_DATE_EPOCH``
fixed: the same inputs give the same bytes); :func:`raw_deb` writes a ``.deb`` byte by byte
(``ar`` of ``debian-binary``, ``control.tar.gz``, ``data.tar.gz``) for the members no
``dpkg-deb`` would accept (``..``, absolute paths). :meth:`DebArchive.publish` writes
``dists/<suite>/main/binary-<arch>/Packages.gz`` as an archive has it, with the suite's
``Release`` listing its sha256 and, when the archive has a :class:`Signer`, ``InRelease``
clear-signed with ``gpg`` by a key made for the test (:func:`make_signers`: ed25519 keys in a
throw-away ``GNUPGHOME``, each exported alone as a binary keyring, as Debian ships its own);
the server is a plain ``http.server`` on 127.0.0.1 that logs every path it served.
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


@dataclass(frozen=True)
class Signer:
    """A signing key made for a test: its ``GNUPGHOME``, fingerprint and exported keyring."""

    home: Path
    fingerprint: str
    keyring: Path


def make_signers(home: Path, names: tuple[str, ...]) -> list[Signer]:
    """One ed25519 signing key per name in the new ``GNUPGHOME`` ``home`` (no passphrase)."""
    home.mkdir(mode=0o700, parents=True)
    out = []
    for name in names:
        subprocess.run(
            [*_gpg(home), "--quick-gen-key", f"{name} <{name}@localhost>", "ed25519", "sign", "never"],
            check=True,
            capture_output=True,
        )
        listed = subprocess.run(
            [*_gpg(home), "--with-colons", "--list-keys", f"{name}@localhost"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:"))
        keyring = home / f"{name}.gpg"
        exported = subprocess.run([*_gpg(home), "--export", fingerprint], check=True, capture_output=True).stdout
        keyring.write_bytes(exported)
        out.append(Signer(home, fingerprint, keyring))
    return out


def stop_agent(home: Path) -> None:
    """Stop the gpg-agent that ``gpg`` started for ``home`` (that one only)."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


def _gpg(home: Path) -> list[str]:
    return ["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", ""]


@dataclass
class DebArchive:
    root: Path
    suite: str = "bookworm"
    arch: str = "amd64"
    stanzas: dict[str, str] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""
    signer: Signer | None = None
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
        preinst: str | None = None,
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
        for script, text in (("postinst", postinst), ("preinst", preinst)):
            if text is not None:
                (tree / "DEBIAN" / script).write_text(text)
                os.chmod(tree / "DEBIAN" / script, 0o755)
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
        self.release()

    def release(self, *, suite: str | None = None, signer: Signer | None = None) -> None:
        """Write ``Release`` listing every index file's sha256, and sign it as ``InRelease``
        (by ``signer``, else the archive's own; none: no InRelease)."""
        dists = self.root / "dists" / self.suite
        lines = []
        for path in sorted(p for p in dists.rglob("Packages*") if p.is_file()):
            data = path.read_bytes()
            lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data):>8} {path.relative_to(dists).as_posix()}")
        release = (
            f"Origin: test\nSuite: {suite or self.suite}\nCodename: {suite or self.suite}\n"
            f"Date: Wed, 01 Jan 2020 00:00:00 UTC\nArchitectures: {self.arch}\nComponents: main\n"
            "SHA256:\n" + "\n".join(lines) + "\n"
        )
        (dists / "Release").write_text(release)
        (dists / "InRelease").unlink(missing_ok=True)
        signer = signer or self.signer
        if signer is not None:
            subprocess.run(
                [*_gpg(signer.home), "--local-user", signer.fingerprint, "--clearsign"]
                + ["--output", str(dists / "InRelease"), str(dists / "Release")],
                check=True,
                capture_output=True,
            )

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


def host_shell_files(tools: tuple[str, ...] = ("mkdir", "ln", "cat", "wc", "chown")) -> dict[str, bytes] | None:
    """The host's ``dash`` as ``usr/bin/sh`` and ``tools`` in ``usr/bin``, with the libraries and
    loader they need (``ldd``) at their paths: a base a test's maintainer scripts can run on.
    None where one is missing."""
    found = {"sh": shutil.which("dash"), **{tool: shutil.which(tool) for tool in tools}}
    if not all(found.values()):
        return None
    files: dict[str, bytes] = {}
    for name, program in found.items():
        assert program is not None
        files[f"usr/bin/{name}"] = Path(program).read_bytes()
        listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=False).stdout
        for line in listed.splitlines():
            words = line.split()
            path = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
            if path.startswith("/"):
                files[path.lstrip("/")] = Path(path).read_bytes()
    return files


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
