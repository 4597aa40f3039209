"""A local stand-in for the Hugging Face Hub and ModelScope, for the real client libraries.

Nothing in the test suite reaches a real hub (DESIGN: testing without GPUs or hubs), so this
module serves, on 127.0.0.1 and a random port, just enough of both hubs' HTTP APIs that the
real ``huggingface_hub`` and ``modelscope_hub`` clients work against it unmodified:

Hugging Face (endpoint ``server.url``):

* ``GET /api/models/{owner}/{name}[/revision/{rev}]`` — model info; with ``?blobs=True``
  (what ``model_info(files_metadata=True)`` sends) each sibling carries ``size``, ``blobId``
  and, for LFS files, ``lfs: {size, sha256, pointerSize}``.
* ``HEAD|GET /{owner}/{name}/resolve/{rev}/{path}`` — downloads with ``X-Repo-Commit``,
  ``ETag`` (git blob sha1, or the sha256 for LFS files), ``X-Linked-Etag`` and
  ``X-Linked-Size`` for LFS files, ``Content-Length``, ``Accept-Ranges`` and single-range
  ``Range`` support (206 with ``Content-Range``).
* ``GET /api/datasets/{owner}/{name}[/revision/{rev}]`` and
  ``HEAD|GET /datasets/{owner}/{name}/resolve/{rev}/{path}`` — the same for dataset repos
  (built with :meth:`HubServer.hf_dataset_commit`).
* Errors as the hub sends them: 404 with ``X-Error-Code: RepoNotFound``,
  ``RevisionNotFound`` or ``EntryNotFound``; 401 with ``GatedRepo`` for a gated repo's files.

ModelScope (endpoint ``server.url``; the legacy ``/api/v1`` surface the client uses):

* ``GET /api/v1/models/{owner}/{name}/revisions`` — ``Data.RevisionMap.{Branches,Tags}``.
* ``GET /api/v1/models/{owner}/{name}/repo/files?Revision=&Recursive=`` — ``Data.Files``,
  each with ``Path``, ``Name``, ``Type`` (``blob``/``tree``), ``Size``, ``Sha256`` and the
  file's own ``Revision`` (the last commit that changed it).
* ``GET|HEAD /api/v1/models/{owner}/{name}/repo?Revision=&FilePath=`` — file download at a
  branch, tag or commit, with ``Range`` support.
* ``GET /api/v1/models/{owner}/{name}`` — repository info.

Plain files for ``url`` weights are served under ``/static/{name}``.

Every request is appended to :attr:`HubServer.requests` (method, path, query, headers) so a
test can check, say, that a resumed download sent a ``Range`` header. A test builds repos
with :meth:`HubServer.hf_commit` / :meth:`HubServer.ms_commit`, moves a ModelScope tag with
:meth:`HubServer.ms_tag`, and can make a download serve wrong bytes
(:meth:`HubServer.tamper`), stop half-way (:meth:`HubServer.cut_next`) or ignore ``Range``
(:attr:`HubServer.honor_ranges`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: File suffixes a fake Hugging Face repo stores in LFS unless a test says otherwise.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".gguf", ".npz")


def sha256_hex(data: bytes) -> str:
    """The sha256 of ``data`` as lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def git_blob_sha1(data: bytes) -> str:
    """The git object id of ``data`` as a blob (what the hub reports as ``blobId``/ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    """One commit of a fake repo: the complete file contents at that commit."""

    sha: str
    parent: str | None
    files: dict[str, bytes]
    lfs: frozenset[str]
    created_at: int


@dataclass
class FakeRepo:
    """A fake hub repository: commits, branches and tags (names to commit shas)."""

    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def resolve(self, revision: str) -> Commit | None:
        """The commit a branch, tag or full commit sha names; None when it names nothing."""
        sha = self.branches.get(revision) or self.tags.get(revision)
        if sha is None and revision in self.commits:
            sha = revision
        return self.commits.get(sha) if sha else None

    def last_change(self, commit: Commit, path: str) -> str:
        """The sha of the newest ancestor of ``commit`` (itself included) that changed ``path``.

        This is ModelScope's per-file ``Revision``.
        """
        current = commit
        while current.parent is not None:
            parent = self.commits[current.parent]
            if parent.files.get(path) != current.files.get(path):
                return current.sha
            current = parent
        return current.sha


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    method: str
    path: str  # URL path, percent-decoded
    query: dict[str, str]
    headers: dict[str, str]  # header names lower-cased


class HubServer:
    """A threaded HTTP server on 127.0.0.1 speaking both hubs' APIs; see the module docstring.

    Use as a context manager or call :meth:`start` and :meth:`stop`. ``url`` is the endpoint
    for both clients (the two hubs' URL spaces do not overlap).
    """

    def __init__(self) -> None:
        self.hf: dict[str, FakeRepo] = {}
        self.hf_datasets: dict[str, FakeRepo] = {}
        self.ms: dict[str, FakeRepo] = {}
        self.static_files: dict[str, bytes] = {}
        self.requests: list[Request] = []
        # Served-byte overrides: (hub, repo, path) -> bytes, to simulate a corrupted transfer.
        self._tampered: dict[tuple[str, str, str], bytes] = {}
        # Downloads to cut off: (path substring, bytes to send before dropping the connection).
        self._cuts: list[tuple[str, int]] = []
        #: False makes downloads ignore ``Range`` and answer 200 with the whole file.
        self.honor_ranges = True
        self._lock = threading.RLock()
        self._counter = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> HubServer:
        """Bind a random loopback port and serve in a daemon thread."""
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, the endpoint of both fake hubs."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ building repos
    def _commit(
        self,
        repos: dict[str, FakeRepo],
        repo_id: str,
        files: Mapping[str, bytes],
        branch: str,
        lfs: Iterable[str] | None,
    ) -> str:
        with self._lock:
            repo = repos.setdefault(repo_id, FakeRepo())
            parent = repo.branches.get(branch)
            n = next(self._counter)
            digest = hashlib.sha1(f"{repo_id}\0{parent}\0{n}".encode())
            for name in sorted(files):
                digest.update(name.encode() + b"\0" + sha256_hex(files[name]).encode())
            sha = digest.hexdigest()
            lfs_set = frozenset(lfs) if lfs is not None else frozenset(p for p in files if p.endswith(LFS_SUFFIXES))
            # A fixed clock keeps tag ordering deterministic; ModelScope reports epoch seconds.
            repo.commits[sha] = Commit(sha, parent, dict(files), lfs_set, 1_700_000_000 + n)
            repo.branches[branch] = sha
            return sha

    def hf_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        branch: str = "main",
        lfs: Iterable[str] | None = None,
        gated: bool = False,
    ) -> str:
        """Commit ``files`` (the repo's complete contents) to a Hugging Face repo's ``branch``.

        Creates the repo if needed. ``lfs`` names the files stored in LFS (default: those
        with a weight-file suffix, :data:`LFS_SUFFIXES`). Returns the new commit sha.
        """
        sha = self._commit(self.hf, repo_id, files, branch, lfs)
        self.hf[repo_id].gated = gated
        return sha

    def hf_dataset_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        branch: str = "main",
        lfs: Iterable[str] | None = None,
    ) -> str:
        """Like :meth:`hf_commit`, for a Hugging Face *dataset* repo (its own namespace)."""
        return self._commit(self.hf_datasets, repo_id, files, branch, lfs)

    def hf_tag(self, repo_id: str, tag: str, commit: str | None = None) -> None:
        """Point a Hugging Face tag at ``commit`` (default: ``main``'s head)."""
        with self._lock:
            repo = self.hf[repo_id]
            repo.tags[tag] = commit or repo.branches["main"]

    def ms_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        branch: str = "master",
        tag: str | None = None,
    ) -> str:
        """Commit ``files`` (complete contents) to a ModelScope repo's ``branch``; tag it if asked.

        Returns the new commit sha.
        """
        sha = self._commit(self.ms, repo_id, files, branch, lfs=files.keys())
        if tag is not None:
            self.ms_tag(repo_id, tag, sha)
        return sha

    def ms_tag(self, repo_id: str, tag: str, commit: str | None = None) -> None:
        """Create or move a ModelScope tag to ``commit`` (default: ``master``'s head)."""
        with self._lock:
            repo = self.ms[repo_id]
            repo.tags[tag] = commit or repo.branches["master"]

    def static(self, name: str, data: bytes) -> str:
        """Serve ``data`` at ``/static/{name}``; returns its URL."""
        with self._lock:
            self.static_files[name] = data
        return f"{self.url}/static/{name}"

    def tamper(self, hub: str, repo_id: str, path: str, data: bytes) -> None:
        """Make downloads of ``path`` in a repo (``hub``: "hf", "hf-dataset", "ms" or "static") serve ``data``.

        Listings keep reporting the original size and hash, as a corrupting proxy would.
        """
        with self._lock:
            self._tampered[(hub, repo_id, path)] = data

    def cut_next(self, path_contains: str, after: int) -> None:
        """Make the next download whose path contains ``path_contains`` stop after ``after``
        body bytes and drop the connection (the full ``Content-Length`` is still announced)."""
        with self._lock:
            self._cuts.append((path_contains, after))

    def take_cut(self, path: str) -> int | None:
        with self._lock:
            for index, (needle, after) in enumerate(self._cuts):
                if needle in path:
                    del self._cuts[index]
                    return after
            return None

    # ------------------------------------------------------------------ request log
    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def clear_requests(self) -> None:
        """Forget the requests received so far."""
        with self._lock:
            self.requests.clear()

    def requests_for(self, path_contains: str, method: str | None = None) -> list[Request]:
        """Requests whose path contains ``path_contains`` (and of ``method``, if given)."""
        with self._lock:
            return [r for r in self.requests if path_contains in r.path and (method is None or r.method == method)]

    def served_bytes(self, hub: str, repo_id: str, path: str, data: bytes) -> bytes:
        with self._lock:
            return self._tampered.get((hub, repo_id, path), data)


_HF_API = re.compile(r"^/api/(?P<kind>models|datasets)/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?/?$")
_HF_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_HF_DATASET_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_MS = re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)(?P<rest>/revisions|/repo/files|/repo)?/?$")


class _Handler(BaseHTTPRequestHandler):
    """Routes one request; ``hub`` is set on a subclass made per server."""

    hub: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, as both clients' connection pools expect

    def log_message(self, format: str, *args: Any) -> None:  # `format`: the stdlib method's parameter name
        pass  # quiet: the request log is in HubServer.requests

    def do_HEAD(self) -> None:  # named by BaseHTTPRequestHandler's dispatch
        self._route(head=True)

    def do_GET(self) -> None:  # named by BaseHTTPRequestHandler's dispatch
        self._route(head=False)

    # ------------------------------------------------------------------ routing
    def _route(self, *, head: bool) -> None:
        split = urlsplit(self.path)
        # Match on the raw path so an encoded "/" inside a revision stays one segment.
        raw_path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.hub.log(Request(self.command, unquote(raw_path), query, headers))
        try:
            if raw_path.startswith("/static/"):
                self._static(unquote(raw_path.removeprefix("/static/")), head=head)
            elif m := _MS.match(raw_path):
                self._modelscope(unquote(m["repo"]), m["rest"] or "", query, head=head)
            elif m := _HF_API.match(raw_path):
                rev = unquote(m["rev"]) if m["rev"] else "main"
                repos = self.hub.hf_datasets if m["kind"] == "datasets" else self.hub.hf
                self._hf_info(repos, unquote(m["repo"]), rev, blobs=query.get("blobs", "").lower() == "true")
            elif m := _HF_DATASET_RESOLVE.match(raw_path):
                self._hf_resolve(
                    self.hub.hf_datasets,
                    unquote(m["repo"]),
                    unquote(m["rev"]),
                    unquote(m["path"]),
                    head=head,
                    hub="hf-dataset",
                )
            elif m := _HF_RESOLVE.match(raw_path):
                self._hf_resolve(self.hub.hf, unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"]), head=head)
            else:
                self._send(404, b"not found", {"Content-Type": "text/plain"}, head=head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-transfer (a test interrupting a download)

    # ------------------------------------------------------------------ transport
    def _send(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        head: bool = False,
        cut: int | None = None,
    ) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True  # the client sees a short body and a closed socket
            return
        self.wfile.write(body)

    def _json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(
            status,
            json.dumps(payload).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    def _file(self, data: bytes, headers: Mapping[str, str], *, head: bool) -> None:
        """Send a file body, honouring a single ``Range: bytes=a-[b]`` request."""
        size = len(data)
        base = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        spec = self.headers.get("Range") if self.hub.honor_ranges else None
        cut = None if head else self.hub.take_cut(unquote(urlsplit(self.path).path))
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip()) if spec else None
        if m and (m[1] or m[2]):
            if m[1]:
                start = int(m[1])
                end = min(int(m[2]), size - 1) if m[2] else size - 1
            else:  # suffix range: the last N bytes
                start, end = max(size - int(m[2]), 0), size - 1
            if start >= size or start > end:
                self._send(416, b"", {**base, "Content-Range": f"bytes */{size}"}, head=head)
                return
            part = data[start : end + 1]
            headers = {**base, "Content-Range": f"bytes {start}-{end}/{size}"}
            self._send(206, part, headers, head=head, cut=cut)
            return
        self._send(200, data, base, head=head, cut=cut)

    # ------------------------------------------------------------------ static files
    def _static(self, name: str, *, head: bool) -> None:
        data = self.hub.static_files.get(name)
        if data is None:
            self._send(404, b"no such file", {"Content-Type": "text/plain"}, head=head)
            return
        self._file(self.hub.served_bytes("static", "", name, data), {}, head=head)

    # ------------------------------------------------------------------ Hugging Face
    def _hf_error(self, status: int, code: str, message: str, *, head: bool = False, **extra: str) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json", **extra}
        self._send(status, json.dumps({"error": message}).encode(), headers, head=head)

    def _hf_info(self, repos: Mapping[str, FakeRepo], repo_id: str, revision: str, *, blobs: bool) -> None:
        repo = repos.get(repo_id)
        if repo is None:
            self._hf_error(404, "RepoNotFound", "Repository not found")
            return
        commit = repo.resolve(revision)
        if commit is None:
            self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        siblings = []
        for path in sorted(commit.files):
            data = commit.files[path]
            entry: dict[str, Any] = {"rfilename": path}
            if blobs:
                entry["size"] = len(data)
                if path in commit.lfs:
                    sha = sha256_hex(data)
                    # For LFS files blobId is the pointer file's oid; any stable id will do.
                    entry["blobId"] = git_blob_sha1(f"oid sha256:{sha}\nsize {len(data)}\n".encode())
                    entry["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
                else:
                    entry["blobId"] = git_blob_sha1(data)
            siblings.append(entry)
        self._json(
            200,
            {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit.sha,
                "private": False,
                "gated": "auto" if repo.gated else False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            },
        )

    def _hf_resolve(
        self, repos: Mapping[str, FakeRepo], repo_id: str, revision: str, path: str, *, head: bool, hub: str = "hf"
    ) -> None:
        repo = repos.get(repo_id)
        if repo is None:
            self._hf_error(404, "RepoNotFound", "Repository not found", head=head)
            return
        commit = repo.resolve(revision)
        if commit is None:
            self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            return
        if repo.gated:
            self._hf_error(401, "GatedRepo", "Access to model is restricted. You must have access to it.", head=head)
            return
        data = commit.files.get(path)
        if data is None:
            self._hf_error(404, "EntryNotFound", "Entry not found", head=head, **{"X-Repo-Commit": commit.sha})
            return
        headers = {"X-Repo-Commit": commit.sha}
        if path in commit.lfs:
            sha = sha256_hex(data)
            headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
        else:
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
        self._file(self.hub.served_bytes(hub, repo_id, path, data), headers, head=head)

    # ------------------------------------------------------------------ ModelScope
    def _ms_reply(self, data: Any, *, status: int = 200, message: str = "success") -> None:
        self._json(
            status,
            {
                "Code": status,
                "Data": data,
                "Message": message,
                "RequestId": hashlib.md5(self.path.encode()).hexdigest(),
                "Success": status == 200,
            },
        )

    def _modelscope(self, repo_id: str, rest: str, query: dict[str, str], *, head: bool) -> None:
        repo = self.hub.ms.get(repo_id)
        if repo is None:
            self._ms_reply(None, status=404, message=f"model {repo_id} not found")
            return
        if rest == "/revisions":

            def detail(name: str, sha: str) -> dict[str, Any]:
                commit = repo.commits[sha]
                return {"Revision": name, "CommitId": sha, "CreatedAt": commit.created_at, "Message": ""}

            self._ms_reply(
                {
                    "RevisionMap": {
                        "Branches": [detail(n, s) for n, s in sorted(repo.branches.items())],
                        "Tags": [detail(n, s) for n, s in sorted(repo.tags.items())],
                    }
                }
            )
            return
        if rest == "":
            self._ms_reply({"Id": 1, "Name": repo_id.split("/")[1], "Path": repo_id.split("/")[0]})
            return
        revision = query.get("Revision") or "master"
        commit = repo.resolve(revision)
        if commit is None:
            self._ms_reply(None, status=404, message=f"revision {revision} not found")
            return
        if rest == "/repo/files":
            self._ms_reply({"Files": self._ms_listing(repo, commit, query)})
            return
        path = query.get("FilePath", "")
        data = commit.files.get(path)
        if data is None:
            self._ms_reply(None, status=404, message=f"file {path} not found")
            return
        self._file(self.hub.served_bytes("ms", repo_id, path, data), {}, head=head)

    def _ms_listing(self, repo: FakeRepo, commit: Commit, query: dict[str, str]) -> list[dict[str, Any]]:
        recursive = query.get("Recursive", "false").lower() == "true"
        root = query.get("Root", "").strip("/")
        entries: dict[str, dict[str, Any]] = {}
        for path in sorted(commit.files):
            if root and not path.startswith(root + "/"):
                continue
            relative = path[len(root) + 1 :] if root else path
            parts = PurePosixPath(relative).parts
            # Directories appear as "tree" entries, as on the real hub.
            for depth in range(1, len(parts)):
                if not recursive and depth > 1:
                    break
                folder = "/".join(filter(None, [root, *parts[:depth]]))
                entries.setdefault(
                    folder,
                    {
                        "Name": parts[depth - 1],
                        "Path": folder,
                        "Type": "tree",
                        "Size": 0,
                        "Revision": commit.sha,
                        "Sha256": "",
                        "IsLFS": False,
                    },
                )
            if not recursive and len(parts) > 1:
                continue
            data = commit.files[path]
            revision = repo.last_change(commit, path)
            entries[path] = {
                "Name": parts[-1],
                "Path": path,
                "Type": "blob",
                "Size": len(data),
                "Sha256": sha256_hex(data),
                "Revision": revision,
                "IsLFS": path in commit.lfs,
                "CommittedDate": repo.commits[revision].created_at,
                "CommitMessage": "",
                "CommitterName": "test",
                "Mode": "33188",
                "Id": git_blob_sha1(data),
            }
        return [entries[k] for k in sorted(entries)]
