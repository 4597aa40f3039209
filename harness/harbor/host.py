"""The host a session ran on, for its record: OS release, kernel, glibc, and the host's
executables that the sandbox exposes.

A session binds the host's ``/usr`` read-only, so a task's ``test.sh`` may run any of its
tools (``bash``, ``grep``, ``git``…). Knowing which ones ran would need tracing every
``exec``; hashing the whole set the sandbox exposes on ``PATH`` (``/usr/local/bin``,
``/usr/bin``, ``/usr/sbin``: about 1,300 files and 400 MB here) is cheaper once cached:
:func:`executables` hashes each file once per (device, inode, size, mtime) and keeps the
hashes in a cache file of the harness home, so later sessions only ``stat`` them. The record
names the set by one digest and the trial keeps the full list beside it.

Those executables, and the interpreter and extension modules of the closure, load shared
libraries from the host (``/usr/lib``: the C library, OpenSSL, libffi…), which change what
a session computes as much as the executables do. :func:`libraries` finds them as the
dynamic loader would, without running anything: each ELF file's ``PT_INTERP`` and
``DT_NEEDED`` entries, resolved through its ``DT_RPATH``/``DT_RUNPATH`` (``$ORIGIN``
expanded), the loader's cache (``ldconfig -p``) and the default folders, transitively; each
library found outside the store is hashed (cached like the executables) and listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import struct
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The folders of the sandbox's PATH that come from the host (``/bin`` and ``/sbin`` are
#: links into /usr on merged-usr systems, else bound read-only too).
BIN_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
CACHE_NAME = "harbor-host-executables.json"
_LOCK = threading.Lock()
_MEMO: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    """``ID``, ``ID_LIKE``, ``VERSION_ID``, ``PRETTY_NAME`` and ``VERSION_CODENAME`` of ``/etc/os-release`` (those present)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ID", "ID_LIKE", "VERSION_ID", "PRETTY_NAME", "VERSION_CODENAME"):
            out[key.lower()] = value.strip().strip('"')
    return out


def summary() -> dict[str, Any]:
    """OS release, kernel, architecture and C library of this host."""
    uname = platform.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc:
        name, version = platform.libc_ver()
        libc = f"{name} {version}".strip()
    return {
        "os": os_release(),
        "kernel": uname.release,
        "kernel_version": uname.version,
        "machine": uname.machine,
        "libc": libc or None,
        "hostname": uname.node,
    }


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def executables(cache_dir: Path | None = None, dirs: tuple[str, ...] = BIN_DIRS) -> dict[str, str]:
    """``{path: sha256}`` of every executable file in ``dirs`` (links resolved to the file
    they name; a path reached twice through a linked folder is listed once, by its real
    folder). Cached in memory and in ``cache_dir/harbor-host-executables.json``."""
    with _LOCK:
        if not _MEMO and cache_dir is not None:
            _load(cache_dir / CACHE_NAME)
        before = len(_MEMO)
        out: dict[str, str] = {}
        seen: set[str] = set()
        changed = False
        for folder in dirs:
            real = os.path.realpath(folder)
            if real in seen or not os.path.isdir(real):
                continue
            seen.add(real)
            try:
                entries = sorted(os.scandir(real), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:  # scandir: one stat per file, a realpath only for links
                path = entry.path
                try:
                    st = entry.stat()
                except OSError:
                    continue  # a dangling link
                if not (st.st_mode & 0o111) or not stat.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                target = os.path.realpath(path) if entry.is_symlink() else path
                memo = _MEMO.get(target)
                if memo is None or memo[0] != key:
                    try:
                        memo = (key, _sha256(target))
                    except OSError:
                        continue  # unreadable to this user: left out
                    _MEMO[target] = memo
                    changed = True
                out[path] = memo[1]
        if cache_dir is not None and (changed or len(_MEMO) != before):
            _save(cache_dir / CACHE_NAME)
        return out


def digest(files: dict[str, str]) -> str:
    """``sha256:`` over the sorted ``path<TAB>sha256`` lines of ``files``."""
    text = "".join(f"{p}\t{h}\n" for p, h in sorted(files.items()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _load(path: Path) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        for target, (key, sha) in data.items():
            dev, ino, size, mtime = (int(k) for k in key)
            _MEMO[target] = ((dev, ino, size, mtime), str(sha))
    except (OSError, ValueError, TypeError):
        pass  # a missing or damaged cache is rebuilt


def _save(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({t: [list(k), s] for t, (k, s) in _MEMO.items()}), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass  # the cache is an optimisation; the record is complete without it


# ------------------------------------------------------------------------ shared libraries

#: Where the loader looks last (glibc's defaults, with Debian's multiarch folders first).
DEFAULT_LIB_DIRS = (
    f"/lib/{platform.machine()}-linux-gnu",
    f"/usr/lib/{platform.machine()}-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)
_ELF_MEMO: dict[str, tuple[tuple[int, int, int, int], tuple[str | None, tuple[str, ...], tuple[str, ...]]]] = {}
_LDCACHE: dict[str, str] | None = None
_PT_INTERP, _PT_DYNAMIC, _PT_LOAD = 3, 2, 1
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29


def elf_dependencies(path: str) -> tuple[str | None, tuple[str, ...], tuple[str, ...]] | None:
    """(``PT_INTERP``, ``DT_NEEDED`` names, ``DT_RPATH`` + ``DT_RUNPATH`` folders) of the ELF
    file at ``path``, read from its headers alone; None for a file that is not ELF (a
    script) or cannot be read. Memoized by file identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    memo = _ELF_MEMO.get(path)
    if memo is not None and memo[0] == key:
        return memo[1]
    try:
        with open(path, "rb") as handle:
            found = _parse_elf(handle)
    except (OSError, struct.error, ValueError):
        found = None
    if found is not None:
        _ELF_MEMO[path] = (key, found)
    return found


def _parse_elf(handle: Any) -> tuple[str | None, tuple[str, ...], tuple[str, ...]] | None:
    ident = handle.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF":
        return None
    wide, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if wide:
        phoff, phentsize, phnum = (
            struct.unpack_from(end + "Q", ident, 0x20)[0],
            *struct.unpack_from(end + "HH", ident, 0x36),
        )
        phdr, dyn = end + "IIQQQQQQ", end + "qQ"
    else:
        phoff, phentsize, phnum = (
            struct.unpack_from(end + "I", ident, 0x1C)[0],
            *struct.unpack_from(end + "HH", ident, 0x2A),
        )
        phdr, dyn = end + "IIIIIIII", end + "iI"
    if phnum > 4096:
        return None
    handle.seek(phoff)
    table = handle.read(phentsize * phnum)
    interp: str | None = None
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        fields = struct.unpack_from(phdr, table, i * phentsize)
        if wide:
            kind, _flags, offset, vaddr, _paddr, filesz = fields[:6]
        else:
            kind, offset, vaddr, _paddr, filesz = fields[:5]
        if kind == _PT_INTERP and filesz < 4096:
            handle.seek(offset)
            interp = handle.read(filesz).split(b"\0")[0].decode(errors="replace")
        elif kind == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None or dynamic[1] > 1 << 20:
        return (interp, (), ()) if interp else None
    handle.seek(dynamic[0])
    raw = handle.read(dynamic[1])
    size = struct.calcsize(dyn)
    entries = [struct.unpack_from(dyn, raw, i) for i in range(0, len(raw) - size + 1, size)]
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    if strtab is None:
        return (interp, (), ())
    base = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
    if base is None:
        return (interp, (), ())

    def string(at: int) -> str:
        handle.seek(base + at)
        return handle.read(4096).split(b"\0")[0].decode(errors="replace")

    needed = tuple(string(v) for t, v in entries if t == _DT_NEEDED)
    paths = tuple(p for t, v in entries if t in (_DT_RPATH, _DT_RUNPATH) for p in string(v).split(":") if p)
    return (interp, needed, paths)


def _ldcache() -> dict[str, str]:
    """soname -> path of the loader's cache for this machine's word size (``ldconfig -p``)."""
    global _LDCACHE
    if _LDCACHE is None:
        out: dict[str, str] = {}
        wide = platform.architecture()[0] == "64bit"
        for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
            try:
                text = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in text.splitlines()[1:]:
                name, _, rest = line.strip().partition(" (")
                flags, _, target = rest.partition(") => ")
                if target and (("64" in flags) == wide or "x86-64" in flags) and name not in out:
                    out[name] = target
            break
        _LDCACHE = out
    return _LDCACHE


def _resolve(name: str, origin: str, search: tuple[str, ...]) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) else None
    for folder in search:
        candidate = os.path.join(folder.replace("$ORIGIN", origin).replace("${ORIGIN}", origin), name)
        if os.path.isfile(candidate):
            return os.path.normpath(candidate)
    cached = _ldcache().get(name)
    if cached and os.path.isfile(cached):
        return cached
    for folder in DEFAULT_LIB_DIRS:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def libraries(
    files: Iterable[str], cache_dir: Path | None = None, *, exclude: tuple[str, ...] = ()
) -> tuple[dict[str, str], list[str]]:
    """``({library path: sha256}, [names not found])``: the shared libraries the ELF files among
    ``files`` load, transitively (module doc); libraries under a folder of ``exclude`` (the
    store: its paths have content hashes of their own) are followed but not listed."""
    with _LOCK:
        if not _MEMO and cache_dir is not None:
            _load(cache_dir / CACHE_NAME)
        before = len(_MEMO)
        seen: set[str] = set()
        todo = [f for f in files]
        found: dict[str, str] = {}
        missing: set[str] = set()
        by_name: dict[str, str] = {}  # a name the loader found once is reused by later objects
        changed = False
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            deps = elf_dependencies(path)
            if deps is None:
                continue
            interp, needed, search = deps
            origin = os.path.dirname(os.path.realpath(path))
            names = [*([interp] if interp else []), *needed]
            for name in names:
                target = _resolve(name, origin, search)
                if target is None:
                    missing.add(name)
                    continue
                by_name[os.path.basename(name)] = target
                real = os.path.realpath(target)
                if real in seen:
                    continue
                todo.append(real)
                if any(real.startswith(e.rstrip("/") + "/") for e in exclude):
                    continue
                try:
                    st = os.stat(real)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                memo = _MEMO.get(real)
                if memo is None or memo[0] != key:
                    try:
                        memo = (key, _sha256(real))
                    except OSError:
                        continue
                    _MEMO[real] = memo
                    changed = True
                found[real] = memo[1]
        if cache_dir is not None and (changed or len(_MEMO) != before):
            _save(cache_dir / CACHE_NAME)
        return found, sorted(missing - set(by_name))


def elf_files(folders: Iterable[Path], limit: int = 20000) -> list[str]:
    """Executable or ``.so`` files under ``folders`` (at most ``limit``): the candidates whose
    libraries :func:`libraries` follows (which skips those that are not ELF)."""
    out: list[str] = []
    for folder in folders:
        for base, _dirs, names in os.walk(folder):
            for name in names:
                path = os.path.join(base, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and (st.st_mode & 0o111 or ".so" in name):
                    out.append(path)
                    if len(out) >= limit:
                        return out
    return out
