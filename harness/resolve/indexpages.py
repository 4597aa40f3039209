"""Where a locked file lives on an index: addresses by name, and the simple repository API.

A lock names each package's index (``pypi`` unless the manifest adds others) and each file by
name and hash, never by URL (DESIGN invariant 4). Realize turns that back into URLs here, from
configuration read at realize time:

* :func:`index_address` — the configured address of an index name
  (:meth:`harness.config.Settings.index_url`); ``pypi`` left unconfigured is uv's own default
  index, learned from uv by :func:`default_index_url`, so harness never names a registry.
* :func:`find_file_urls` — the download URLs of named files of one project, read from the
  index's project page: PEP 691 JSON when the index speaks it (asked for with ``Accept``),
  PEP 503 HTML otherwise (many mirrors, the PyTorch indexes). Relative links are resolved
  against the page's final URL, ``#sha256=…`` fragments dropped (the lock's hash is the one
  checked, by the downloader). ``file://`` indexes are read as static PEP 503 trees
  (``<index>/<project>/index.html``).

Answers are cached per process (thread-safe; concurrent callers wait for one fetch), so one
realize reads each project page once however many files it takes from it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

from packaging.utils import canonicalize_name

from harness.download import TIMEOUT_S, open_url, redact, split_credentials
from harness.config import Settings
from harness.errors import HarnessError
from harness.resolve.uvtool import run_uv

_JSON = "application/vnd.pypi.simple.v1+json"
# PEP 691's recommended negotiation: JSON first, then the versioned HTML, then any HTML.
_ACCEPT = f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"

_lock = threading.Lock()
#: (UV_DEFAULT_INDEX, UV_INDEX_URL) as seen when asked -> what uv said its default index is.
_default_urls: dict[tuple[str | None, str | None], str] = {}
#: (index URL, normalized project) -> file name -> URL; None for a project the index lacks.
_pages: dict[tuple[str, str], _Page | None] = {}
_page_locks: dict[tuple[str, str], threading.Lock] = {}


def default_index_url(cache_dir: Path | None = None) -> str:
    """The address of uv's default index, as the uv harness drives reports it.

    Asked of uv itself — ``uv pip compile --emit-index-url --offline`` over an empty input,
    which prints the index it would use without touching the network — so the address is
    never written in harness, and ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` (which
    :func:`~harness.resolve.uvtool.run_uv` passes through) move it exactly as they move uv.
    The answer is cached per process and per value of those two variables. ``cache_dir`` is
    uv's cache (None: none). Raises :class:`HarnessError` if uv fails or prints no address.
    """
    key = (os.environ.get("UV_DEFAULT_INDEX"), os.environ.get("UV_INDEX_URL"))
    with _lock:
        if key in _default_urls:
            return _default_urls[key]
    # uv needs an interpreter to "resolve" even nothing; the one running harness always exists.
    args = ["pip", "compile", "-", "--emit-index-url", "--offline", "--no-header", "--quiet"]
    if sys.executable:
        args += ["--python", sys.executable]
    proc = run_uv(args, cache_dir=cache_dir, timeout=60)
    match = re.search(r"^--index-url\s+(\S+)\s*$", proc.stdout, re.M)
    if not match:
        raise HarnessError(
            f"uv did not say which default index it uses (it printed {proc.stdout.strip()!r})",
            hint='configure the index explicitly: [indexes] pypi = "<url>" or HARNESS_INDEX_PYPI',
        )
    url = match.group(1)
    with _lock:
        _default_urls[key] = url
    return url


def index_address(name: str, settings: Settings, cache_dir: Path | None = None) -> str:
    """The address of the index a lock names ``name``, from ``settings`` at this moment.

    ``pypi`` with no configured address is :func:`default_index_url`. An unconfigured other
    name raises :class:`~harness.errors.InputError` saying where to configure it.
    """
    url = settings.index_url(name)
    return url if url is not None else default_index_url(cache_dir)


def find_file_urls(
    index_url: str, project: str, file_names: Iterable[str], *, index_name: str | None = None
) -> dict[str, str]:
    """The download URL of each of ``file_names`` (wheels, sdists) of ``project`` on the index.

    Returns ``{file name: absolute URL}`` for exactly the names asked. The URL has no
    fragment; credentials written in ``index_url`` are kept on URLs of the same host (uv
    does the same), for :func:`harness.download.download` to send. ``index_name``
    names the index in errors (default: its redacted address).

    Raises :class:`HarnessError` naming index, file and project when the index lacks a file
    or the project ("index 'pypi' has no file X for project Y"), and when the index is
    unreachable or answers with an error.
    """
    wanted = list(dict.fromkeys(file_names))
    shown = repr(index_name) if index_name else redact(index_url)
    files = _project_files(index_url, project, shown)
    if files is None:
        raise HarnessError(
            f"index {shown} has no file {', '.join(wanted)} for project {project}: "
            f"it has no project {canonicalize_name(project)}",
            hint="is the right index configured for this name? (harness.toml, $HARNESS_HOME/config.toml, "
            "HARNESS_INDEX_<NAME>)",
        )
    missing = [name for name in wanted if name not in files]
    if missing:
        noun = "file" if len(missing) == 1 else "files"
        raise HarnessError(
            f"index {shown} has no {noun} {', '.join(missing)} for project {project}",
            hint="the index or mirror does not carry what the lock names; configure one that does, or re-lock",
        )
    return {name: files[name] for name in wanted}


def read_linked_file(index_url: str, project: str, file_name: str, *, index_name: str, limit: int) -> bytes | None:
    """The bytes of ``file_name`` as ``project``'s page on the index links it (a small file
    served beside the wheels, such as a release's ``-variants.json``), None when the page does
    not link it or the index has no such project. At most ``limit`` bytes; HarnessError
    naming the index when it cannot be read or is larger."""
    shown = repr(index_name)
    files = _project_files(index_url, project, shown)
    name = next((n for n in files or () if n.lower() == file_name.lower()), None)
    if files is None or name is None:
        return None
    url = files[name]
    bare, auth = split_credentials(url)
    if bare.startswith("file://"):
        path = Path(urllib.request.url2pathname(urlsplit(bare).path))
        try:
            with path.open("rb") as f:
                data = f.read(limit + 1)
        except OSError as exc:
            raise HarnessError(f"index {shown}: cannot read {file_name}: {exc.strerror}") from None
    else:
        request = urllib.request.Request(bare)
        for key, value in auth.items():
            request.add_unredirected_header(key, value)
        try:
            with open_url(request, timeout=TIMEOUT_S) as response:
                data = response.read(limit + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise HarnessError(f"index {shown}: HTTP {exc.code} {exc.reason} for {file_name}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise HarnessError(f"cannot read {file_name} from index {shown}: {exc}") from None
    if len(data) > limit:
        raise HarnessError(f"index {shown}: {file_name} is larger than {limit} bytes")
    return data


def clear_cache() -> None:
    """Forget cached default index addresses and project pages (for long-lived processes)."""
    with _lock:
        _default_urls.clear()
        _pages.clear()
        _page_locks.clear()


# ---------------------------------------------------------------------------------------------
# Reading project pages
# ---------------------------------------------------------------------------------------------


def _project_files(index_url: str, project: str, shown: str) -> _Page | None:
    """File name -> URL for ``project`` on the index (cached); None when it has no such project."""
    key = (index_url.rstrip("/"), canonicalize_name(project))
    with _lock:
        if key in _pages:
            return _pages[key]
        page_lock = _page_locks.setdefault(key, threading.Lock())
    with page_lock:  # one fetch per page, however many threads ask at once
        with _lock:
            if key in _pages:
                return _pages[key]
        files = _read_project_page(key[0], key[1], shown)
        with _lock:
            _pages[key] = files
        return files


def _read_project_page(index_url: str, project: str, shown: str) -> _Page | None:
    bare, auth = split_credentials(index_url)
    if bare.startswith("file://"):
        return _read_file_page(bare, project, shown)
    page_url = f"{bare}/{project}/"
    request = urllib.request.Request(page_url, headers={"Accept": _ACCEPT})
    for key, value in auth.items():
        request.add_unredirected_header(key, value)  # credentials never follow a redirect elsewhere
    try:
        with open_url(request, timeout=TIMEOUT_S) as response:
            final_url = response.geturl()
            content_type = response.headers.get_content_type()
            body = response.read()
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code in (404, 410):
            return None
        raise HarnessError(f"index {shown}: HTTP {exc.code} {exc.reason} from {redact(page_url)}") from None
    except urllib.error.URLError as exc:
        raise HarnessError(f"cannot reach index {shown} at {redact(page_url)}: {exc.reason}") from None
    except OSError as exc:
        raise HarnessError(f"cannot reach index {shown} at {redact(page_url)}: {exc!r}") from None
    if content_type == _JSON:
        links = _json_links(body, shown, page_url)
    else:
        links = _html_links(body.decode("utf-8", errors="replace"))
    return _Page(links, final_url, index_url)


def _read_file_page(bare: str, project: str, shown: str) -> _Page | None:
    root = Path(urllib.request.url2pathname(urlsplit(bare).path))
    page = root / project / "index.html"
    if not page.is_file():
        if not root.is_dir():
            raise HarnessError(f"index {shown}: {root} is not a folder")
        return None
    return _Page(_html_links(page.read_text(errors="replace")), page.as_uri(), bare)


def _json_links(body: bytes, shown: str, page_url: str) -> list[tuple[str, str]]:
    try:
        data = json.loads(body)
        return [(str(f["filename"]), str(f["url"])) for f in data["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise HarnessError(f"index {shown}: {redact(page_url)} is not a PEP 691 project page ({exc!r})") from None


class _Anchors(HTMLParser):
    """Collects (text, href) of every ``<a>``, and a ``<base href>`` if the page has one."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []
        self.base: str | None = None
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append(("".join(self._text).strip(), self._href))
            self._href = None


def _html_links(text: str) -> list[tuple[str, str]]:
    """(file name, href) per PEP 503 anchor; the name is the URL's last path segment."""
    parser = _Anchors()
    parser.feed(text)
    parser.close()
    out = []
    for anchor_text, href in parser.links:
        if parser.base:
            href = urljoin(parser.base, href)
        # PEP 503: the anchor text must match the final path segment; the URL is what counts.
        name = unquote(PurePosixPath(urlsplit(href).path).name) or anchor_text
        out.append((name, href))
    return out


class _Page(Mapping[str, str]):
    """A project page's files, name -> absolute URL, each URL resolved when it is asked for:
    a page lists thousands of files (every release's wheels) and a lock asks for one or two,
    and resolving a link (``urljoin``, ``urlsplit``) costs more than reading it."""

    def __init__(self, links: list[tuple[str, str]], page_url: str, index_url: str) -> None:
        self._hrefs: dict[str, str] = {}
        for name, href in links:
            self._hrefs.setdefault(name, href)  # the first link of a name counts
        self._page_url = page_url
        self._index = urlsplit(index_url)

    def __getitem__(self, name: str) -> str:
        return _absolute(self._hrefs[name], self._page_url, self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._hrefs

    def __iter__(self) -> Iterator[str]:
        return iter(self._hrefs)

    def __len__(self) -> int:
        return len(self._hrefs)


def _absolute(href: str, page_url: str, index: SplitResult) -> str:
    """Resolve a link against the page, drop its fragment, and carry index credentials to its host."""
    url = urljoin(page_url, href).split("#", 1)[0]
    target = urlsplit(url)
    if (
        index.username is not None
        and target.hostname == index.hostname
        and target.port == index.port
        and target.username is None
    ):
        # Same host as a credentialed index: the file needs the same credentials.
        url = url.replace(f"{target.scheme}://", f"{target.scheme}://{index.netloc.rsplit('@', 1)[0]}@", 1)
    return url


__all__ = ["clear_cache", "default_index_url", "find_file_urls", "index_address", "read_linked_file"]
