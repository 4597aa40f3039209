"""Standard exports of a lock: hashed ``requirements.txt`` and PEP 751 ``pylock.toml``.

Both are derived from the lock alone plus addresses from configuration, so they say exactly
what the lock says. The requirements export carries every allowed file's sha256, so
``pip install --require-hashes`` or ``uv pip install`` checks each byte.

The pylock export needs each file's URL, which a lock never holds (DESIGN invariant 4). At
export time harness asks the index that the lock names, at the address configuration gives
it, for the project's file list (the simple repository API: PEP 691 JSON, or PEP 503 HTML
where that is all the index serves), and takes the URL of the file with the locked name,
checking that the index's sha256 agrees with the lock's. The ``pypi`` index left at uv's
default is asked for at uv's own default address, learned from uv at run time
(``uv pip compile --emit-index-url``), so no address is ever written into harness.

Nothing is dropped silently. Git sources (their URLs through this machine's
``[git-mirrors]``) are pinned by commit: in the pylock as PEP 751 ``vcs`` packages (installed
as regular packages: the format has no editable VCS entry); in requirements.txt as commented
``name @ git+URL@commit`` lines in a block of their own, because pip and uv refuse a file
that mixes hashed lines with an unhashable VCS line, so they are installed separately
(``--no-deps``). Checkout-only sources (``install = "none"``, and ``"path"``: a checkout on
the environment's sys.path, which no installer can express) and weight sets, which no
Python installer reads, are listed in comment blocks. :func:`unexported` names all of these
for the CLI to say so.
"""

from __future__ import annotations

import html.parser
import json
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urljoin, urlsplit

from harness.config import DEFAULT_INDEX, Settings
from harness.errors import HarnessError
from harness.lock.document import Lock, LockedFile, LockedPackage, LockedSource

if TYPE_CHECKING:
    import tomlkit.items

_JSON = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
_TIMEOUT_S = 60.0

#: Sources that are checkouts, not packages: no installer's format can carry them.
CHECKOUT_ONLY = ("none", "path")


def to_requirements(lock: Lock, settings: Settings) -> str:
    """A hashed requirements.txt; index addresses only where configuration names them."""
    lines = [
        f"# Exported by harness from locks/{lock.name}.lock.toml for "
        f"{lock.python.implementation} {lock.python.version} on {lock.python.platform}.",
        "# Every file is pinned by sha256; install with --require-hashes.",
    ]
    indexes = sorted({p.index for p in lock.packages}, key=lambda n: (n != DEFAULT_INDEX, n))
    for name in indexes:
        url = settings.index_url(name)  # names compare like package names; unknown: a clear error
        if url:  # an unconfigured pypi stays the installer's own default
            flag = "--index-url" if name == DEFAULT_INDEX else "--extra-index-url"
            lines.append(f"{flag} {url}")
    for package in sorted(lock.packages, key=lambda p: p.name):
        lines.append(_requirement(package))
    installed = [s for s in lock.sources if s.install not in CHECKOUT_ONLY]
    if installed:
        lines += [
            "",
            "# Git sources, pinned by commit. A VCS line has no hash, and pip and uv refuse a file",
            "# mixing it with hashed lines: install these after the lines above, with --no-deps:",
        ]
        lines += [f"# {_git_requirement(s, settings)}" for s in installed]
    return "\n".join(lines + _comment_blocks(lock, settings)) + "\n"


def _git_url(source: LockedSource, settings: Settings) -> str:
    from harness.resolve.git import fetch_url

    url = fetch_url(source.repo, settings.git_mirrors)
    return url if "://" in url else (f"ssh://{url.replace(':', '/', 1)}" if "@" in url else f"file://{url}")


def _git_requirement(source: LockedSource, settings: Settings) -> str:
    line = f"{source.name} @ git+{_git_url(source, settings)}@{source.commit}"
    if source.subdirectory:
        line += f"#subdirectory={source.subdirectory}"
    return line


def _comment_blocks(lock: Lock, settings: Settings) -> list[str]:
    """Comment lines for what no Python installer reads: checkout-only sources, weights."""
    lines: list[str] = []
    checkouts = [s for s in lock.sources if s.install in CHECKOUT_ONLY]
    if checkouts:
        lines += [
            "",
            '# Checkouts (install = "none" or "path"): not installed; `harness realize` places them in its',
            '# store, and puts a "path" one on the environment\'s sys.path.',
        ]
        lines += [f"#   {s.name}: {_git_url(s, settings)} at {s.commit} ({s.install})" for s in checkouts]
    if lock.weights:
        lines += ["", "# Weights: no installer fetches these; `harness realize` does, file by file, hash-checked."]
        for w in lock.weights:
            where = f"{w.provider} {w.repo}" + (f" ({w.repo_type})" if w.repo_type != "model" else "")
            revision = f" at {w.revision}" if w.revision else ""
            size = sum(f.size for f in w.files)
            lines.append(f"#   {w.dir}: {where}{revision}, {len(w.files)} file(s), {size} bytes")
    return lines


def unexported(lock: Lock, fmt: str) -> list[str]:
    """What the export of ``lock`` in ``fmt`` carries only as comments (for a note)."""
    out = []
    installed = [s.name for s in lock.sources if s.install not in CHECKOUT_ONLY]
    if installed and fmt == "requirements":
        out.append(f"git source(s) {', '.join(installed)} as commented lines to install separately")
    checkouts = [s.name for s in lock.sources if s.install in CHECKOUT_ONLY]
    if checkouts:
        out.append(f"checkout(s) {', '.join(checkouts)} as comments")
    if lock.weights:
        out.append(f"weights {', '.join(w.dir for w in lock.weights)} as comments")
    return out


def _requirement(package: LockedPackage) -> str:
    head = f"{package.name}=={package.version}"
    if package.marker:
        head += f" ; {package.marker}"
    files = [w.sha256 for w in package.wheels] + ([package.sdist.sha256] if package.sdist else [])
    hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in sorted(set(files)))
    return head + hashes


# --- PEP 751 ------------------------------------------------------------------------------


def to_pylock(lock: Lock, settings: Settings, cache_dir: Path | None = None) -> str:
    """A PEP 751 ``pylock.toml`` of the lock's packages, every file with the URL its index
    serves it at now (module doc). ``cache_dir`` is uv's cache, used only to ask uv for its
    default index. Raises HarnessError for an index that cannot be reached or no longer lists
    a locked file, or lists it with another sha256."""
    import tomlkit

    addresses: dict[str, str] = {}
    for name in sorted({p.index for p in lock.packages}):
        url = settings.index_url(name)
        addresses[name] = url if url is not None else uv_default_index(cache_dir)

    def listing(package: LockedPackage) -> dict[str, tuple[str, str | None]]:
        return index_files(addresses[package.index], package.name, index=package.index)

    packages = sorted(lock.packages, key=lambda p: (p.name, p.version, p.marker))
    with ThreadPoolExecutor(max_workers=8) as pool:
        listings = list(pool.map(listing, packages))

    doc = tomlkit.document()
    doc.add(
        tomlkit.comment(
            f"Exported by harness from locks/{lock.name}.lock.toml for {lock.python.implementation} "
            f"{lock.python.version} on {lock.python.platform}; addresses from this machine's configuration."
        )
    )
    doc["lock-version"] = "1.0"
    doc["created-by"] = "harness"
    major, minor = lock.python.version.split(".")[:2]
    doc["requires-python"] = f"=={major}.{minor}.*"
    entries = tomlkit.aot()
    for package, files in zip(packages, listings, strict=True):
        table = tomlkit.table()
        table["name"] = package.name
        table["version"] = package.version
        if package.marker:
            table["marker"] = package.marker
        table["index"] = addresses[package.index]
        if package.sdist is not None:
            table["sdist"] = _pylock_file(package, package.sdist, files)
        if package.wheels:
            wheels = tomlkit.array()
            wheels.extend(_pylock_file(package, w, files) for w in sorted(package.wheels, key=lambda w: w.file))
            table["wheels"] = wheels.multiline(True)
        entries.append(table)
    for source in lock.sources:
        if source.install in CHECKOUT_ONLY:
            continue
        table = tomlkit.table()
        table["name"] = source.name
        vcs = tomlkit.inline_table()
        vcs["type"] = "git"
        vcs["url"] = _git_url(source, settings)
        vcs["requested-revision"] = source.rev
        vcs["commit-id"] = source.commit
        if source.subdirectory:
            vcs["subdirectory"] = source.subdirectory
        table["vcs"] = vcs
        entries.append(table)
    doc["packages"] = entries
    text = tomlkit.dumps(doc)
    blocks = _comment_blocks(lock, settings)
    return text + ("\n".join(blocks) + "\n" if blocks else "")


def _pylock_file(
    package: LockedPackage, file: LockedFile, files: dict[str, tuple[str, str | None]]
) -> tomlkit.items.InlineTable:
    import tomlkit

    found = files.get(file.file)
    if found is None:
        raise HarnessError(
            f"{package.name} {package.version}: index {package.index!r} no longer lists {file.file}",
            hint="re-lock to pin files the index serves",
        )
    url, sha256 = found
    if sha256 is not None and sha256 != file.sha256:
        raise HarnessError(
            f"{package.name} {package.version}: index {package.index!r} lists {file.file} with "
            f"sha256 {sha256}, the lock has {file.sha256}"
        )
    table = tomlkit.inline_table()
    table["name"] = file.file
    table["url"] = url
    table["size"] = file.size
    hashes = tomlkit.inline_table()
    hashes["sha256"] = file.sha256
    table["hashes"] = hashes
    return table


def uv_default_index(cache_dir: Path | None = None) -> str:
    """The address of uv's default index on this machine (``UV_DEFAULT_INDEX`` if set), as uv
    itself reports it; harness never names it. No network."""
    from harness.resolve.uvtool import run_uv

    with tempfile.TemporaryDirectory(prefix="harness-export-") as tmp:
        (Path(tmp) / "requirements.in").write_text("")
        out = run_uv(
            ["pip", "compile", "requirements.in", "--emit-index-url", "--offline", "--no-header", "--quiet"],
            cache_dir=cache_dir,
            cwd=Path(tmp),
        ).stdout
    match = re.search(r"^--index-url\s+(\S+)", out, re.MULTILINE)
    if not match:
        raise HarnessError(f"uv did not report its default index (output: {out.strip()!r})")
    return match.group(1)


def index_files(index_url: str, project: str, *, index: str = "") -> dict[str, tuple[str, str | None]]:
    """File name → (absolute URL, sha256 or None) of ``project`` on the simple-API index at
    ``index_url`` (PEP 691 JSON when served, else PEP 503 HTML)."""
    normalized = re.sub(r"[-_.]+", "-", project).lower()
    page = index_url.rstrip("/") + f"/{normalized}/"
    label = f"index {index!r}" if index else f"index {index_url}"
    request = urllib.request.Request(page, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            body = response.read()
            final = response.geturl()
            content_type = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise HarnessError(
                f"{label} does not list {project} ({page}: HTTP 404)",
                hint="is the configured address this index or a full mirror of it?",
            ) from None
        raise HarnessError(f"{label}: {page} answered HTTP {exc.code} for {project}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HarnessError(f"{label}: cannot reach {page}: {reason}") from None
    if content_type.split(";")[0].strip() == _JSON:
        try:
            data = json.loads(body)
            return {
                str(f["filename"]): (urljoin(final, str(f["url"])), _sha256(f.get("hashes"))) for f in data["files"]
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise HarnessError(f"{label}: malformed PEP 691 answer for {project}: {exc}") from None
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    files: dict[str, tuple[str, str | None]] = {}
    for href in parser.hrefs:
        url = urljoin(final, href)
        base, _, fragment = url.partition("#")
        name = unquote(urlsplit(base).path.rsplit("/", 1)[-1])
        match = re.search(r"(?:^|&)sha256=([0-9a-fA-F]{64})", fragment)
        files[name] = (base, match.group(1).lower() if match else None)
    return files


def _sha256(hashes: object) -> str | None:
    value = hashes.get("sha256") if isinstance(hashes, dict) else None
    return value.lower() if isinstance(value, str) else None


class _Links(html.parser.HTMLParser):
    """The ``href`` of every ``<a>`` of a PEP 503 page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: Iterable[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)
