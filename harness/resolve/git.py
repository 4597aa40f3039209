"""Git sources: pin a manifest's ``[[environment.sources]]`` entry, and export it again.

:func:`lock_source` resolves a branch, tag or commit to a full commit and records the
content hash of that commit's files (the store's NAR scheme, ``harness.store.hashing``);
:func:`export_source` writes the same files again and checks them against that hash, so
every byte entering the store is one the lock recorded (DESIGN invariant 3). Realize exports
with ``check_tree=False``: the store hashes what it is given anyway (``Store.stage``) and
the builder compares that hash with the lock's, so the files are read once, not twice.

Each repository gets one bare mirror, ``<cache_dir>/git/<hash of its URL>.git`` (in a
shared home, in the member's own ``cache/git-<uid>``: :func:`mirrors_folder`), that holds
every branch and tag (and any commit fetched by id); it is only written under a file lock
beside it, and offline work reads it alone. The system ``git`` binary does the work,
always with argument lists (never a shell) and never prompting.

What is exported is the commit's tree exactly as git stores it: blob bytes as committed,
``100755`` files executable, symlinks as symlinks. ``.gitattributes`` (eol conversion,
``export-ignore``, ``export-subst``, filters such as Git LFS) and the user's git config do
not apply, so the same commit always gives the same bytes (LFS files stay pointers).
``git checkout-index`` writes them, two processes per repository however many files it has
(:func:`_write_tree`), in a private git directory whose attributes and settings switch every
conversion off and which reads the mirror's objects without writing to it.

**Submodules** are pinned recursively: each gitlink of the commit's tree is a submodule at
that path and commit, its URL read from the commit's own ``.gitmodules`` (a relative URL,
``../other.git``, is resolved against the parent's URL as git does). Each gets its own
mirror, is fetched (by id when no branch holds the commit) and exported into its path, so
the tree hash covers every submodule's files and the lock lists each one's path, URL and
commit. Realize exports from the lock's list, offline from the mirrors.

**Git mirrors** (settings ``[git-mirrors]``, :func:`fetch_url`): a canonical URL, or a prefix
of URLs ending in ``/``, maps to a mirror (``file://``, ``https://``, ssh) that is fetched
from instead. Locks and cache mirrors keep the canonical URL, so the same lock realizes on
an offline cluster that has only a local mirror.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import blake3

from harness.errors import HarnessError
from harness.manifests.model import Source
from harness.resolve.pins import GitSource, Submodule
from harness.store.hashing import content_hash, nix_base32

_FULL_HEX = re.compile(r"^[0-9a-fA-F]{40}$")
_SHORT_HEX = re.compile(r"^[0-9a-fA-F]{4,39}$")

# Variables that point git at another repository, index or object store (set, for example,
# when harness runs inside a git hook); the mirror must be the only repository git sees.
_REPO_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_GRAFT_FILE",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_IMPLICIT_WORK_TREE",
)


class GitError(HarnessError):
    """A git source cannot be fetched, resolved or exported as the lock says."""


# ----------------------------------------------------------------------------- running git


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _REPO_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"  # fail instead of asking for a password
    env["GCM_INTERACTIVE"] = "never"  # nor through Git Credential Manager
    env["GIT_NO_REPLACE_OBJECTS"] = "1"  # refs/replace must not change what a commit holds
    # Every network wait ends: an http(s) transfer slower than 1 byte/s for two minutes is
    # abandoned, and ssh gives up on a host that does not answer (unless the user set ssh up).
    env.setdefault("GIT_HTTP_LOW_SPEED_LIMIT", "1")
    env.setdefault("GIT_HTTP_LOW_SPEED_TIME", "120")
    if "GIT_SSH_COMMAND" not in env and "GIT_SSH" not in env:
        env["GIT_SSH_COMMAND"] = "ssh -o ConnectTimeout=30 -o ServerAliveInterval=15 -o ServerAliveCountMax=8"
    return env


def _git(args: Sequence[str], *, git_dir: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``git [--git-dir=D] ARGS``; raise GitError on failure when ``check``."""
    command = ["git", *([f"--git-dir={git_dir}"] if git_dir else []), *args]
    try:
        result = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, env=_environment())
    except FileNotFoundError:
        raise GitError("git is not installed (git sources need the git command)") from None
    if check and result.returncode != 0:
        raise GitError(f"git {args[0]} failed: {_stderr_line(result.stderr)}")
    return result


def _stderr_line(stderr: bytes) -> str:
    """The most telling line of git's stderr: its first ``fatal:``/``error:``, else its last.

    (git's last line is often advice such as "and the repository exists.")
    """
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return line.removeprefix(prefix)
    return lines[-1] if lines else "no message from git"


# ------------------------------------------------------------------------------ the mirror


def mirrors_folder(cache_dir: Path) -> Path:
    """The folder of the mirrors of the home whose cache folder is ``cache_dir``: its
    ``git/``, or, in a shared home, this member's own ``cache/git-<uid>`` (``0700``,
    :func:`harness.store.shared.own_cache_folder`, made when missing).

    Git runs a repository's hooks and reads its config and refs, so a mirror the group could
    write would let any member run code as the next member to fetch into it (a
    ``reference-transaction`` hook), redirect that fetch (``url.<x>.insteadOf``), or move the
    branch an offline lock resolves, and replace its objects, which git does not check
    against their names when it reads them. Each member fetches into mirrors of their own;
    what they realize from them is still shared, as checked store paths."""
    from harness.store.shared import is_shared, own_cache_folder

    if cache_dir.name == "cache" and is_shared(cache_dir.parent):
        return own_cache_folder(cache_dir.parent, "git")
    return cache_dir / "git"


def mirror_path(cache_dir: Path, repo: str) -> Path:
    """Where the bare mirror of ``repo`` (its URL exactly as written) lives
    (in :func:`mirrors_folder`)."""
    digest = blake3.blake3(b"harness-git-mirror-v1\0" + repo.encode()).digest(length=20)
    return mirrors_folder(cache_dir) / f"{nix_base32(digest)}.git"


def fetch_url(repo: str, mirrors: Mapping[str, str] | None) -> str:
    """Where ``repo`` is fetched from: its mirror in ``mirrors`` (an exact URL first, then
    the longest key ending in ``/`` that prefixes it, the rest appended), else itself."""
    if not mirrors:
        return repo
    if repo in mirrors:
        return mirrors[repo]
    prefixes = [key for key in mirrors if key.endswith("/") and repo.startswith(key)]
    if not prefixes:
        return repo
    key = max(prefixes, key=len)
    return mirrors[key] + repo[len(key) :]


def _shown(repo: str, url: str) -> str:
    return repo if url == repo else f"{repo} (through its mirror {url})"


def _check_repo(repo: str) -> None:
    """Refuse a relative local path: it would mean a different repository in each cwd."""
    scp_like = re.match(r"^[^/]*:", repo) is not None  # host:path, as git reads it
    if "://" in repo or scp_like:
        return
    if not os.path.isabs(repo):
        raise GitError(f"git source {repo!r} is a relative path; use an absolute path or a file:// URL")


@contextmanager
def _locked_mirror(cache_dir: Path, repo: str) -> Iterator[Path]:
    """Hold the mirror's file lock; yields the mirror's path (which may not exist yet)."""
    mirror = mirror_path(cache_dir, repo)
    mirror.parent.mkdir(parents=True, exist_ok=True)
    from harness.store.store import lock_file

    with lock_file(Path(f"{mirror}.lock")):
        yield mirror


def _create_mirror(mirror: Path, repo: str) -> None:
    """Make an empty bare repository at ``mirror`` (created beside it, then renamed in)."""
    staging = mirror.parent / f".init-{os.getpid()}-{os.urandom(6).hex()}"
    staging.mkdir()
    try:
        _git(["init", "--bare", "--quiet", str(staging)])
        # Recorded for people reading the cache; fetches always name the URL explicitly.
        _git(["config", "remote.origin.url", repo], git_dir=staging)
        os.rename(staging, mirror)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: The upload-pack a fetch from a repository on this machine runs (git starts it through the
#: shell, in that repository). git refuses to serve a repository another user owns ("dubious
#: ownership") unless ``safe.directory`` allows it, and clears ``-c`` settings and
#: ``GIT_CONFIG_*`` from a local upload-pack's environment, so the setting goes on its own
#: command line. It covers that one process, which opens the one repository a manifest (or a
#: mirror setting) names: a lab's shared repository, or a colleague's, whose code harness then
#: builds and runs anyway.
_TRUSTING_UPLOAD_PACK = "git -c safe.directory='*' upload-pack"


def is_local_url(url: str) -> bool:
    """Whether git fetches ``url`` by running upload-pack on this machine: a ``file://`` URL or
    a path (git's rule: no ``scheme://``, and no colon before the first slash, which would make
    it ssh's ``host:path``)."""
    if "://" in url:
        return url.startswith("file://")
    colon, slash = url.find(":"), url.find("/")
    return colon == -1 or (slash != -1 and slash < colon)


def _fetch(mirror: Path, repo: str, refspecs: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    # Never for a remote: over ssh the option would change the command the server is asked to run.
    trusting = ["--upload-pack", _TRUSTING_UPLOAD_PACK] if is_local_url(repo) else []
    return _git(
        ["fetch", "--quiet", "--prune", "--no-tags", "--force", *trusting, "--", repo, *refspecs],
        git_dir=mirror,
        check=False,
    )


def _update_mirror(mirror: Path, repo: str) -> None:
    """Create the mirror if needed and fetch every branch and tag of ``repo`` into it."""
    created = not mirror.exists()
    if created:
        _create_mirror(mirror, repo)
    result = _fetch(mirror, repo, ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"])
    if result.returncode != 0:
        if created:  # an empty mirror would later pass for one that was fetched
            shutil.rmtree(mirror, ignore_errors=True)
        raise GitError(f"cannot fetch {repo}: {_stderr_line(result.stderr)}")


def _fetch_commit(mirror: Path, repo: str, commit: str) -> bool:
    """Ask ``repo`` for one commit by id (one no branch or tag holds); True if it came.

    Kept under ``refs/harness/commits/`` so garbage collection keeps it and offline work
    finds it; ``--prune`` only touches the namespaces a fetch names, never that one.
    """
    result = _fetch(mirror, repo, [f"+{commit}:refs/harness/commits/{commit}"])
    return result.returncode == 0 and _has_commit(mirror, commit)


def _no_mirror(repo: str) -> GitError:
    return GitError(
        f"{repo} has no local mirror to work offline from", hint="lock or realize it once without --offline"
    )


# ---------------------------------------------------------------------------- resolution


def _peel(mirror: Path, name: str) -> str | None:
    """The commit ``name`` (a full ref name or an object id) peels to, or None."""
    result = _git(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}"], git_dir=mirror, check=False
    )
    return result.stdout.decode().strip() if result.returncode == 0 else None


def _has_commit(mirror: Path, commit: str) -> bool:
    return _peel(mirror, commit) == commit


def _is_ref_name(name: str) -> bool:
    """Whether ``refs/x/<name>`` is a well-formed ref, so that git's revision syntax
    (``main~1``, ``v1^{tree}``, ``@{yesterday}``) can never sneak in through a rev."""
    result = _git(["check-ref-format", f"refs/x/{name}"], check=False)
    return result.returncode == 0


def _resolve(mirror: Path, repo: str, rev: str, *, offline: bool) -> str:
    """The full commit ``rev`` names in the mirror, in git's order of precedence.

    A 40-hex rev is a commit id (fetched by id if no branch or tag holds it); a rev
    starting with ``refs/`` is that exact ref (fetched on its own, as ``refs/pull/…`` are
    not mirrored); otherwise a tag (annotated tags peeled), then a branch, then an
    abbreviated commit id.
    """
    where = f"the local mirror of {repo} (offline)" if offline else repo
    if _FULL_HEX.match(rev):
        commit = rev.lower()
        if _has_commit(mirror, commit) or (not offline and _fetch_commit(mirror, repo, commit)):
            return commit
        raise GitError(f"commit {commit} is not in {where}")
    if _is_ref_name(rev):
        if rev.startswith("refs/"):
            names = [rev]
            if not offline and not rev.startswith(("refs/heads/", "refs/tags/")):
                _fetch(mirror, repo, [f"+{rev}:{rev}"])  # absent upstream: "unknown rev" below
        else:
            names = [f"refs/tags/{rev}", f"refs/heads/{rev}"]
        for name in names:
            if _git(["rev-parse", "--verify", "--quiet", name], git_dir=mirror, check=False).returncode == 0:
                peeled = _peel(mirror, name)
                if peeled is None:
                    raise GitError(f"{name} of {repo} does not point to a commit")
                return peeled
    if _SHORT_HEX.match(rev):
        peeled = _peel(mirror, rev.lower())
        if peeled is not None:
            return peeled
        matches = _git(["rev-parse", f"--disambiguate={rev.lower()}"], git_dir=mirror, check=False).stdout.split()
        if len(matches) > 1:
            raise GitError(
                f"rev {rev!r} of {repo} is ambiguous: {len(matches)} objects start with it; give more digits"
            )
    raise GitError(f"rev {rev!r} is not a branch, tag or commit of {where}")


# -------------------------------------------------------------------------------- export


@dataclass(frozen=True)
class _Entry:
    """One blob of a commit's tree, from ``git ls-tree -r``."""

    mode: str
    kind: str  # "blob", or "commit" for a submodule
    oid: str
    path: str


def _ls_tree(mirror: Path, commit: str) -> list[_Entry]:
    output = _git(["ls-tree", "-r", "-z", "--full-tree", commit], git_dir=mirror).stdout
    entries = []
    for record in output.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        entries.append(_Entry(mode, kind, oid, os.fsdecode(path)))
    return entries


def _is_gitlink(entry: _Entry) -> bool:
    return entry.mode == "160000" or entry.kind == "commit"


def _check_entries(entries: Sequence[_Entry], repo: str, commit: str) -> None:
    """Refuse paths no checkout would write (``..``, ``.git``, absolute)."""
    for entry in entries:
        if _is_gitlink(entry) and not _FULL_HEX.match(entry.oid):
            raise GitError(f"{repo} at {commit}: submodule {entry.path!r} records {entry.oid!r}, not a commit")
        parts = entry.path.split("/")
        if any(part in ("", ".", "..") or part.lower() == ".git" for part in parts):
            raise GitError(f"{repo} at {commit} has an unsafe path {entry.path!r}; refusing it")


def _check_subdirectory(entries: Sequence[_Entry], subdirectory: str | None, repo: str, commit: str) -> None:
    if subdirectory is None:
        return
    sub = PurePosixPath(subdirectory).as_posix()
    if sub == ".":
        return
    if any(entry.path == sub for entry in entries):
        raise GitError(f"subdirectory {subdirectory!r} of {repo} at {commit} is a file, not a directory")
    if not any(entry.path.startswith(sub + "/") for entry in entries):
        raise GitError(f"subdirectory {subdirectory!r} does not exist in {repo} at {commit}")


def _check_layout(entries: Sequence[_Entry]) -> None:
    """Refuse a malformed tree (fsck would) that lists a path twice or puts an entry under a
    file or symlink: written out, the second would replace the first or follow the symlink.
    Pure; ``entries`` are the files and symlinks to write (gitlinks are checked when their
    submodule is written into place)."""
    leaves: set[str] = set()
    dirs: set[str] = set()
    for entry in entries:
        if entry.path in leaves:
            raise GitError(f"malformed tree: {entry.path!r} collides with another entry")
        leaves.add(entry.path)
        parent = entry.path
        while True:  # add every ancestor; one already present had its own ancestors added
            parent = parent.rpartition("/")[0]
            if not parent or parent in dirs:
                break
            dirs.add(parent)
    clash = leaves & dirs
    if clash:
        raise GitError(f"malformed tree: {min(clash)!r} collides with another entry")


#: What git would otherwise change between a blob and the file it writes: end-of-line
#: conversion (``text``, ``eol``, ``crlf``), smudge filters (Git LFS included), ``ident``
#: expansion and re-encoding. This file is ``$GIT_DIR/info/attributes`` of the private git
#: directory an export runs in, which outranks every ``.gitattributes`` of the commit.
_RAW_ATTRIBUTES = "* -text -filter -ident -working-tree-encoding\n"

#: Settings that make ``read-tree``/``checkout-index`` write blobs as stored whatever the
#: user's git config says: symlinks as symlinks, no eol conversion, every path the tree
#: holds (``_check_entries`` has refused the unsafe ones; protectNTFS would refuse more
#: than the store can hold), no sparse checkout, fsmonitor or split index.
_CHECKOUT_CONFIG = (
    f"core.attributesFile={os.devnull}",  # not even ~/.config/git/attributes
    "core.symlinks=true",
    "core.autocrlf=false",
    "core.eol=lf",
    "core.safecrlf=false",
    "core.ignoreCase=false",
    "core.precomposeUnicode=false",
    "core.protectNTFS=false",
    "core.protectHFS=false",
    "core.sparseCheckout=false",
    "core.fsmonitor=false",
    "core.splitIndex=false",
    "index.sparse=false",
)

#: ``checkout.workers``: git's parallel checkout, one worker per CPU (0), for trees of more
#: than ``checkout.thresholdForParallelism`` (100) files.
_CHECKOUT_WORKERS = 0


def _checkout_environment(git_dir: Path, work_tree: Path) -> dict[str, str]:
    """:func:`_environment` for git working in ``git_dir`` on ``work_tree`` with no config
    or attributes of the user's or the system's (``GIT_CONFIG_*`` variables included)."""
    env = {key: value for key, value in _environment().items() if not key.startswith(("GIT_CONFIG", "GIT_ATTR"))}
    env.update(
        GIT_DIR=os.path.abspath(git_dir),  # absolute: git runs with the work tree as its cwd
        GIT_WORK_TREE=os.path.abspath(work_tree),
        GIT_INDEX_FILE=os.path.abspath(git_dir / "index"),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
    )
    return env


def _private_git_dir(mirror: Path, where: Path) -> Path:
    """A throwaway git directory under ``where`` that reads ``mirror``'s objects (through
    ``objects/info/alternates``, so nothing is ever written into the mirror, which may be
    another user's or read-only) and holds :data:`_RAW_ATTRIBUTES` and its own index."""
    git_dir = Path(tempfile.mkdtemp(prefix=".export-", dir=where))
    (git_dir / "refs").mkdir()
    (git_dir / "objects" / "info").mkdir(parents=True)
    (git_dir / "info").mkdir()
    (git_dir / "HEAD").write_text("ref: refs/heads/export\n")
    (git_dir / "objects" / "info" / "alternates").write_bytes(os.fsencode(mirror.resolve() / "objects") + b"\n")
    (git_dir / "info" / "attributes").write_text(_RAW_ATTRIBUTES)
    return git_dir


def _write_tree(mirror: Path, commit: str, entries: Sequence[_Entry], dest: Path) -> None:
    """Write the files and symlinks of ``commit`` (its ``entries``, gitlinks left out) under
    ``dest``, an existing empty directory, from the mirror's objects.

    Two git processes, whatever the number of files: ``read-tree`` puts the commit into a
    private index and ``checkout-index`` writes the listed paths (git's parallel checkout
    on several CPUs). Files are ``0644``, or ``0755`` for ``100755`` blobs (umask ``022``
    for git, whatever this process's), directories ``0755``; blob bytes are written as
    stored (:data:`_RAW_ATTRIBUTES`, :data:`_CHECKOUT_CONFIG`). A malformed tree is refused
    (:func:`_check_layout`) before anything is written.
    """
    files = [entry for entry in entries if not _is_gitlink(entry)]
    _check_layout(files)
    if not files:
        return
    git_dir = _private_git_dir(mirror, mirror.parent)
    try:
        env = _checkout_environment(git_dir, dest)
        config = [arg for setting in _CHECKOUT_CONFIG for arg in ("-c", setting)]
        workers = ["-c", f"checkout.workers={_CHECKOUT_WORKERS}"]
        runs = (
            (["git", *config, "read-tree", commit], b""),
            (
                ["git", *config, *workers, "checkout-index", "--force", "--quiet", "-z", "--stdin"],
                b"".join(os.fsencode(entry.path) + b"\0" for entry in files),
            ),
        )
        for command, stdin in runs:
            try:
                result = subprocess.run(command, input=stdin, capture_output=True, cwd=dest, env=env, umask=0o022)
            except FileNotFoundError:
                raise GitError("git is not installed (git sources need the git command)") from None
            if result.returncode != 0:
                raise GitError(f"cannot write {commit} from {mirror}: {_stderr_line(result.stderr)}")
    finally:
        shutil.rmtree(git_dir, ignore_errors=True)


def _export_commit(mirror: Path, commit: str, entries: Sequence[_Entry], dest: Path) -> None:
    dest.mkdir()
    _write_tree(mirror, commit, entries, dest)


# ---------------------------------------------------------------------------- submodules

#: Submodules inside submodules inside …: deeper than this is a cycle or a mistake.
_MAX_SUBMODULE_DEPTH = 8


def join_url(parent: str, url: str) -> str:
    """A submodule URL from ``.gitmodules``: absolute as written, or ``./x`` / ``../x``
    resolved against the parent repository's URL, as ``git submodule`` does. Pure."""
    if not url.startswith(("./", "../")):
        return url
    base = parent.rstrip("/")
    rest = url
    while rest.startswith(("./", "../")):
        if rest.startswith("./"):
            rest = rest[2:]
            continue
        rest = rest[3:]
        head, sep, _ = base.rpartition("/")
        if not sep or head.endswith(":/") or head.endswith("/") and head.rstrip("/").endswith(":"):
            raise GitError(f"submodule URL {url!r} climbs above {parent!r}")
        base = head
    return f"{base}/{rest}" if rest else base


def _gitmodules(mirror: Path, commit: str, repo: str) -> dict[str, str]:
    """``.gitmodules`` of ``commit``: submodule path → URL as written."""
    result = _git(["config", "--blob", f"{commit}:.gitmodules", "--list", "-z"], git_dir=mirror, check=False)
    if result.returncode != 0:
        raise GitError(f"{repo} at {commit} has submodules but no readable .gitmodules: {_stderr_line(result.stderr)}")
    paths: dict[str, str] = {}
    urls: dict[str, str] = {}
    for record in result.stdout.split(b"\0"):
        key, _, value = record.decode(errors="replace").partition("\n")
        match = re.fullmatch(r"submodule\.(.+)\.(path|url)", key)
        if match:
            (paths if match.group(2) == "path" else urls)[match.group(1)] = value
    return {path: urls[name] for name, path in paths.items() if name in urls}


def _ensure_commit(
    cache_dir: Path, repo: str, commit: str, *, offline: bool, mirrors: Mapping[str, str] | None
) -> list[_Entry]:
    """Make the mirror of ``repo`` hold ``commit`` (fetching unless ``offline``); its tree."""
    url = fetch_url(repo, mirrors)
    with _locked_mirror(cache_dir, repo) as mirror:
        if not (mirror.exists() and _has_commit(mirror, commit)):
            if offline:
                if not mirror.exists():
                    raise _no_mirror(repo)
                raise GitError(
                    f"commit {commit} of {repo} is not in the local mirror (offline)",
                    hint="lock or realize it once without --offline",
                )
            _update_mirror(mirror, url)
            if not (_has_commit(mirror, commit) or _fetch_commit(mirror, url, commit)):
                raise GitError(f"commit {commit} is not available from {_shown(repo, url)}")
        entries = _ls_tree(mirror, commit)
    _check_entries(entries, repo, commit)
    return entries


def _pin_submodules(
    cache_dir: Path,
    repo: str,
    commit: str,
    entries: Sequence[_Entry],
    *,
    offline: bool,
    mirrors: Mapping[str, str] | None,
    prefix: str = "",
    depth: int = 0,
) -> list[Submodule]:
    """Every submodule under ``entries`` (the tree of ``repo`` at ``commit``), recursively."""
    links = [e for e in entries if _is_gitlink(e)]
    if not links:
        return []
    if depth >= _MAX_SUBMODULE_DEPTH:
        raise GitError(f"{repo}: submodules nest deeper than {_MAX_SUBMODULE_DEPTH} levels at {prefix!r}")
    urls = _gitmodules(mirror_path(cache_dir, repo), commit, repo)
    found: list[Submodule] = []
    for link in links:
        if link.path not in urls:
            raise GitError(f"{repo} at {commit}: submodule {link.path!r} has no url in .gitmodules")
        url = join_url(repo, urls[link.path])
        _check_repo(url)
        sub_entries = _ensure_commit(cache_dir, url, link.oid, offline=offline, mirrors=mirrors)
        path = prefix + link.path
        found.append(Submodule(path=path, url=url, commit=link.oid))
        found += _pin_submodules(
            cache_dir, url, link.oid, sub_entries, offline=offline, mirrors=mirrors, prefix=path + "/", depth=depth + 1
        )
    return sorted(found)


def _export_submodules(
    cache_dir: Path, submodules: Sequence[Submodule], dest: Path, *, offline: bool, mirrors: Mapping[str, str] | None
) -> None:
    """Write each submodule's files into its path under ``dest`` (parents before children)."""
    for sub in sorted(submodules, key=lambda s: s.path.split("/")):
        entries = _ensure_commit(cache_dir, sub.url, sub.commit, offline=offline, mirrors=mirrors)
        target = dest / sub.path
        if target.is_symlink() or (target.exists() and any(target.iterdir())):
            raise GitError(f"submodule path {sub.path!r} collides with other files of the source")
        _make_inside(dest, sub.path)
        with _locked_mirror(cache_dir, sub.url) as mirror:
            _write_tree(mirror, sub.commit, entries, target)


def _make_inside(root: Path, path: str) -> None:
    """Create ``root/path`` and any missing parents as directories, following no symlink:
    a lock's submodule path under a symlink of the source must not lead git out of it."""
    current = root
    for part in PurePosixPath(path).parts:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise GitError(f"submodule path {path!r} collides with other files of the source")
        if not current.exists():
            current.mkdir()


# -------------------------------------------------------------------------------- public


def lock_source(
    source: Source,
    cache_dir: Path,
    *,
    offline: bool = False,
    mirrors: Mapping[str, str] | None = None,
    keep: Path | None = None,
) -> GitSource:
    """Pin ``source``: resolve its rev to a full commit, pin its submodules recursively and
    hash the files of all of them together.

    Fetches every branch and tag into the repository's mirror first unless ``offline``
    (then only the mirror is read, so branches resolve as last fetched), from the mirror
    ``mirrors`` names for its URL if any (:func:`fetch_url`). Raises GitError when the
    repository or a submodule cannot be fetched, the rev names no commit, or
    ``source.subdirectory`` is not a directory in it.

    The files are exported to be hashed; ``keep`` (a path that must not exist yet, its
    parent a directory) is where they are left afterwards, exactly what
    :func:`export_source` of the returned pin would write there, so a caller that needs them
    (``harness lock`` reads each installed source's build requirements) exports once. On
    failure nothing is left at ``keep``. Without it they are removed.
    """
    repo = source.repo
    _check_repo(repo)
    if keep is not None and os.path.lexists(keep):
        raise GitError(f"cannot export {repo} into {keep}: it already exists")
    url = fetch_url(repo, mirrors)
    with _locked_mirror(cache_dir, repo) as mirror:
        if offline:
            if not mirror.exists():
                raise _no_mirror(repo)
        else:
            _update_mirror(mirror, url)
        commit = _resolve(mirror, url, source.rev, offline=offline)
        entries = _ls_tree(mirror, commit)
    _check_entries(entries, repo, commit)
    submodules = _pin_submodules(cache_dir, repo, commit, entries, offline=offline, mirrors=mirrors)
    _check_subdirectory(entries + _submodule_entries(submodules), source.subdirectory, repo, commit)
    scratch: Path | None = None
    if keep is None:
        scratch = Path(tempfile.mkdtemp(prefix=".lock-", dir=mirror_path(cache_dir, repo).parent))
        out = scratch / "tree"
    else:
        out = keep
    try:
        _write_source(cache_dir, repo, commit, entries, submodules, out, offline=True, mirrors=mirrors)
        tree = content_hash(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return GitSource(
        name=source.name,
        repo=repo,
        rev=source.rev,
        commit=commit,
        tree=tree,
        install=source.install,
        subdirectory=source.subdirectory,
        submodules=tuple(submodules),
        build_isolation=source.build_isolation,
    )


def _write_source(
    cache_dir: Path,
    repo: str,
    commit: str,
    entries: Sequence[_Entry],
    submodules: Sequence[Submodule],
    out: Path,
    *,
    offline: bool,
    mirrors: Mapping[str, str] | None,
) -> None:
    """Write ``commit`` of ``repo`` (its tree ``entries``, already checked) and its
    ``submodules`` into ``out``, a new directory: the one export that locking and realizing
    share, so both hash the same files."""
    with _locked_mirror(cache_dir, repo) as mirror:
        _export_commit(mirror, commit, entries, out)
    _export_submodules(cache_dir, submodules, out, offline=offline, mirrors=mirrors)


def tree_mismatch(repo: str, commit: str, actual: str, expected: str) -> str:
    """The message for files of ``repo`` at ``commit`` that do not hash to the lock's tree."""
    return f"{repo} at {commit}: the exported files hash to {actual}, the lock expects {expected}"


def _submodule_entries(submodules: Sequence[Submodule]) -> list[_Entry]:
    """Submodule folders as entries, so a subdirectory inside one is found."""
    return [_Entry("040000", "tree", s.commit, f"{s.path}/.") for s in submodules]


def export_source(
    pin: GitSource,
    cache_dir: Path,
    dest: Path,
    *,
    offline: bool,
    mirrors: Mapping[str, str] | None = None,
    check_tree: bool = True,
) -> None:
    """Write the files of ``pin.commit`` and of ``pin.submodules`` into ``dest``, which must
    not exist yet.

    Uses the mirrors, fetching (unless ``offline``; through ``mirrors`` where configured)
    when one lacks a commit. The files are written beside ``dest`` and renamed into place
    only once ``content_hash`` of them equals ``pin.tree``; otherwise GitError names the
    repo, commit, expected and actual hashes, and nothing is left at ``dest``.

    ``check_tree=False`` skips that hash (a full read of every file): for a caller that
    hashes ``dest`` itself and compares the result with ``pin.tree`` before trusting it, as
    realize does through the store. Nothing else about the export changes.
    """
    if not _FULL_HEX.match(pin.commit):
        raise GitError(f"lock entry for {pin.repo} has commit {pin.commit!r}, not 40 hex digits")
    if os.path.lexists(dest):
        raise GitError(f"cannot export {pin.repo} into {dest}: it already exists")
    _check_repo(pin.repo)
    commit = pin.commit.lower()
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = fetch_url(pin.repo, mirrors)
    with _locked_mirror(cache_dir, pin.repo) as mirror:
        if not (mirror.exists() and _has_commit(mirror, commit)):
            if offline:
                if not mirror.exists():
                    raise _no_mirror(pin.repo)
                raise GitError(
                    f"commit {commit} of {pin.repo} is not in the local mirror (offline)",
                    hint="realize it once without --offline",
                )
            _update_mirror(mirror, url)
            if not (_has_commit(mirror, commit) or _fetch_commit(mirror, url, commit)):
                raise GitError(f"commit {commit} is no longer available from {_shown(pin.repo, url)}")
        entries = _ls_tree(mirror, commit)
        _check_entries(entries, pin.repo, commit)
        staging = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
    try:
        _write_source(cache_dir, pin.repo, commit, entries, pin.submodules, staging, offline=offline, mirrors=mirrors)
        if check_tree:
            actual = content_hash(staging)
            if actual != pin.tree:
                raise GitError(tree_mismatch(pin.repo, commit, actual, pin.tree))
        os.rename(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


__all__ = ["GitError", "export_source", "fetch_url", "join_url", "lock_source", "mirror_path", "tree_mismatch"]
