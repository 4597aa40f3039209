"""Git sources: real repositories made in the test, used through file:// URLs."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.manifests.model import Source
from harness.resolve.git import GitError, export_source, lock_source, mirror_path
from harness.resolve.pins import GitSource
from harness.store.hashing import content_hash

IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


@pytest.fixture(autouse=True)
def _isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the tests' git nor harness's may read the user's or the system's git config."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(cwd: Path, *args: str, input_text: str | None = None) -> str:
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **IDENTITY},
        input=input_text,
    )
    return result.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@dataclass
class Upstream:
    """A repository with history: c1 → c2 → c3 (c3's files equal c1's) on main, c4 on
    branch feature (from c1), tag v1 (lightweight, c1) and v2 (annotated, c2)."""

    path: Path
    url: str
    c1: str
    c2: str
    c3: str
    c4: str


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("one\n")
    (repo / "pkg" / "src").mkdir(parents=True)
    (repo / "pkg" / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    (repo / "pkg" / "src" / "mod.py").write_text("X = 1\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (repo / "bin" / "tool").chmod(0o755)
    (repo / "link").symlink_to("README")
    c1 = commit_all(repo, "c1")
    git(repo, "tag", "v1")
    (repo / "README").write_text("two\n")
    c2 = commit_all(repo, "c2")
    git(repo, "tag", "-a", "v2", "-m", "release two")
    (repo / "README").write_text("one\n")
    c3 = commit_all(repo, "c3")
    git(repo, "checkout", "-q", "-b", "feature", c1)
    (repo / "feature.txt").write_text("feature\n")
    c4 = commit_all(repo, "c4")
    git(repo, "checkout", "-q", "main")
    return Upstream(repo, repo.as_uri(), c1, c2, c3, c4)


def lock(up: Upstream, cache: Path, rev: str, *, offline: bool = False, subdirectory: str | None = None) -> GitSource:
    return lock_source(Source(repo=up.url, rev=rev, subdirectory=subdirectory), cache, offline=offline)


def checkout_hash(up: Upstream, commit: str, tmp_path: Path) -> str:
    """content_hash of a plain ``git clone`` checkout of ``commit`` with .git removed."""
    work = tmp_path / f"checkout-{commit[:8]}"
    git(tmp_path, "clone", "-q", "--no-checkout", str(up.path), str(work))
    git(work, "checkout", "-q", commit)
    shutil.rmtree(work / ".git")
    return content_hash(work)


# --------------------------------------------------------------------------------- locking


def test_lock_by_branch_pins_commit_and_tree_of_a_checkout(upstream: Upstream, tmp_path: Path) -> None:
    pin = lock_source(Source(repo=upstream.url, rev="main", install="editable", subdirectory="pkg"), tmp_path / "cache")
    assert (pin.name, pin.repo, pin.rev) == ("upstream", upstream.url, "main")
    assert (pin.commit, pin.install, pin.subdirectory) == (upstream.c3, "editable", "pkg")
    assert pin.tree == checkout_hash(upstream, upstream.c3, tmp_path)
    assert lock(upstream, tmp_path / "cache", "feature").commit == upstream.c4


def test_lock_by_tags_peels_annotated_tags(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert lock(upstream, cache, "v1").commit == upstream.c1
    annotated = lock(upstream, cache, "v2")
    assert annotated.commit == upstream.c2  # the commit, not the tag object
    assert annotated.commit != git(upstream.path, "rev-parse", "v2")
    assert lock(upstream, cache, "refs/tags/v2").commit == upstream.c2


def test_lock_by_full_and_abbreviated_commit(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert lock(upstream, cache, upstream.c2).commit == upstream.c2
    assert lock(upstream, cache, upstream.c2.upper()).commit == upstream.c2
    short = lock(upstream, cache, upstream.c4[:8])
    assert (short.commit, short.rev) == (upstream.c4, upstream.c4[:8])


def test_same_files_at_two_commits_give_the_same_tree(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, second, third = (lock(upstream, cache, c) for c in (upstream.c1, upstream.c2, upstream.c3))
    assert first.commit != third.commit
    assert first.tree == third.tree
    assert first.tree != second.tree


def test_relocking_follows_a_moved_branch(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = lock(upstream, cache, "main")
    assert lock(upstream, cache, "main") == before  # unchanged input, identical pin
    (upstream.path / "new.txt").write_text("new\n")
    moved = commit_all(upstream.path, "c5")
    after = lock(upstream, cache, "main")
    assert after.commit == moved
    assert after.tree != before.tree


def test_lock_by_a_commit_no_branch_or_tag_holds(upstream: Upstream, tmp_path: Path) -> None:
    """Like a pull request's head: fetched by id, then kept for offline use."""
    git(upstream.path, "checkout", "-q", "--detach", upstream.c1)
    (upstream.path / "pr.txt").write_text("pr\n")
    orphan = commit_all(upstream.path, "pr")
    git(upstream.path, "update-ref", "refs/pull/1/head", orphan)
    git(upstream.path, "checkout", "-q", "main")
    cache = tmp_path / "cache"
    assert lock(upstream, cache, orphan).commit == orphan
    assert lock(upstream, cache, orphan, offline=True).commit == orphan
    assert lock(upstream, cache, "refs/pull/1/head").commit == orphan


def test_unknown_rev_names_repo_and_rev(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(GitError, match=r"rev 'nope' is not a branch, tag or commit of file://"):
        lock(upstream, cache, "nope")
    # Revision syntax is never evaluated: 'main~1' is not c2.
    with pytest.raises(GitError, match=r"rev 'main~1' is not a branch, tag or commit"):
        lock(upstream, cache, "main~1")
    with pytest.raises(GitError, match=r"commit 0{40} is not in file://"):
        lock(upstream, cache, "0" * 40)


def test_unreachable_repo_is_a_clear_error(tmp_path: Path) -> None:
    missing = (tmp_path / "nowhere").as_uri()
    with pytest.raises(GitError) as caught:
        lock_source(Source(repo=missing, rev="main"), tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith(f"cannot fetch {missing}: ")
    assert "does not appear to be a git repository" in message
    assert "\n" not in message
    # A failed first fetch leaves no empty mirror behind to pass for a fetched one.
    assert not mirror_path(tmp_path / "cache", missing).exists()


def test_relative_local_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GitError, match="relative path"):
        lock_source(Source(repo="some/checkout", rev="main"), tmp_path / "cache")


def test_subdirectory_must_be_a_directory_of_the_commit(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert lock(upstream, cache, "main", subdirectory="pkg/src").subdirectory == "pkg/src"
    with pytest.raises(GitError, match=r"subdirectory 'nope' does not exist in file://.* at " + upstream.c3):
        lock(upstream, cache, "main", subdirectory="nope")
    with pytest.raises(GitError, match=r"subdirectory 'README' .* is a file"):
        lock(upstream, cache, "main", subdirectory="README")
    # feature.txt exists only on the feature branch, so not at v1.
    with pytest.raises(GitError, match="does not exist"):
        lock(upstream, cache, "v1", subdirectory="feature.txt")


def test_a_submodule_without_gitmodules_is_refused_by_name(upstream: Upstream, tmp_path: Path) -> None:
    git(upstream.path, "update-index", "--add", "--cacheinfo", f"160000,{upstream.c1},vendor/dep")
    git(upstream.path, "commit", "-q", "-m", "add a submodule")
    with pytest.raises(GitError, match=r"has submodules but no readable \.gitmodules"):
        lock(upstream, tmp_path / "cache", "main")


# --------------------------------------------------------------------------------- export


def test_export_writes_the_commit_and_verifies_it(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    pin = lock(upstream, cache, "v2")
    dest = tmp_path / "store" / "src"
    export_source(pin, cache, dest, offline=False)
    assert content_hash(dest) == pin.tree
    assert (dest / "README").read_text() == "two\n"
    assert os.access(dest / "bin" / "tool", os.X_OK)
    assert not os.access(dest / "README", os.X_OK)
    assert os.readlink(dest / "link") == "README"
    assert not (dest / ".git").exists()
    with pytest.raises(GitError, match="already exists"):
        export_source(pin, cache, dest, offline=False)


def test_export_with_a_wrong_expectation_fails_and_leaves_nothing(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    pin = lock(upstream, cache, "main")
    wrong = dataclasses.replace(pin, tree="blake3:" + "0" * 64)
    dest = tmp_path / "store" / "src"
    with pytest.raises(GitError) as caught:
        export_source(wrong, cache, dest, offline=False)
    message = str(caught.value)
    for part in (upstream.url, pin.commit, wrong.tree, pin.tree):
        assert part in message
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_export_unchecked_leaves_the_tree_hash_to_the_caller(upstream: Upstream, tmp_path: Path) -> None:
    """``check_tree=False`` (realize, whose store hashes the files once) reads no file back:
    a wrong expectation goes unnoticed here, and the files are the commit's all the same."""
    cache = tmp_path / "cache"
    pin = lock(upstream, cache, "main")
    wrong = dataclasses.replace(pin, tree="blake3:" + "0" * 64)
    dest = tmp_path / "store" / "src"
    export_source(wrong, cache, dest, offline=False, check_tree=False)
    assert content_hash(dest) == pin.tree


def test_export_catches_a_tampered_mirror(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    pin = lock(upstream, cache, "main")
    mirror = mirror_path(cache, upstream.url)
    blob = git(upstream.path, "rev-parse", f"{pin.commit}:pkg/src/mod.py")
    loose = mirror / "objects" / blob[:2] / blob[2:]
    assert loose.exists(), "small fetches arrive as loose objects"
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob 6\0X = 2\n"))  # same size, other bytes
    dest = tmp_path / "store" / "src"
    with pytest.raises(GitError, match="the lock expects " + pin.tree):
        export_source(pin, cache, dest, offline=True)
    assert not dest.exists()


def test_export_fetches_a_commit_the_mirror_lacks(upstream: Upstream, tmp_path: Path) -> None:
    pin = lock(upstream, tmp_path / "cache", "feature")
    fresh_cache = tmp_path / "other-cache"
    with pytest.raises(GitError, match="no local mirror"):
        export_source(pin, fresh_cache, tmp_path / "a", offline=True)
    export_source(pin, fresh_cache, tmp_path / "b", offline=False)
    assert (tmp_path / "b" / "feature.txt").read_text() == "feature\n"


def test_export_refuses_a_malformed_commit(upstream: Upstream, tmp_path: Path) -> None:
    pin = dataclasses.replace(lock(upstream, tmp_path / "cache", "main"), commit="main")
    with pytest.raises(GitError, match="not 40 hex digits"):
        export_source(pin, tmp_path / "cache", tmp_path / "dest", offline=True)


# -------------------------------------------------------------------------------- offline


def test_offline_works_from_the_mirror_alone(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    online = lock(upstream, cache, "main")
    lock(upstream, cache, upstream.c2[:10])
    shutil.move(upstream.path, tmp_path / "gone")  # no upstream to reach any more
    assert lock(upstream, cache, "main", offline=True) == online
    assert lock(upstream, cache, "v2", offline=True).commit == upstream.c2
    assert lock(upstream, cache, upstream.c2[:10], offline=True).commit == upstream.c2
    export_source(online, cache, tmp_path / "dest", offline=True)
    assert content_hash(tmp_path / "dest") == online.tree
    with pytest.raises(GitError, match="cannot fetch"):
        lock(upstream, cache, "main")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="hands the repository to another user (needs root)")
def test_a_repository_another_user_owns_is_fetched_by_path_and_file_url(upstream: Upstream, tmp_path: Path) -> None:
    """A lab's shared repository, or a colleague's, on this machine: git refuses to serve a
    repository its user does not own ("dubious ownership") unless told it is safe; harness
    tells it so for the one upload-pack of that fetch. By branch, by a commit no branch holds
    (fetched by id), through a file:// URL and a plain path, and exported again."""
    git(upstream.path, "checkout", "-q", "--detach", upstream.c2)
    (upstream.path / "loose.txt").write_text("loose\n")
    loose = commit_all(upstream.path, "loose")
    git(upstream.path, "checkout", "-q", "main")
    subprocess.run(["chown", "-R", "65534:65534", str(upstream.path)], check=True)
    refused = subprocess.run(
        ["git", "ls-remote", upstream.url], capture_output=True, text=True, env={**os.environ, **IDENTITY}
    )
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr, "git itself refuses this repository"
    cache = tmp_path / "cache"
    pin = lock(upstream, cache, "main")
    assert pin.commit == upstream.c3
    assert lock(upstream, cache, loose).commit == loose
    by_path = lock_source(Source(repo=str(upstream.path), rev="feature"), tmp_path / "cache-by-path")
    assert by_path.commit == upstream.c4
    export_source(pin, tmp_path / "fresh-cache", tmp_path / "dest", offline=False)
    assert content_hash(tmp_path / "dest") == pin.tree


def test_local_urls_are_told_from_remote_ones() -> None:
    """git's rule: file:// and paths are fetched by an upload-pack on this machine; every
    other scheme, and ssh's host:path, are not (and keep git's own upload-pack)."""
    from harness.resolve.git import is_local_url

    for url in ("file:///srv/git/a.git", "/srv/git/a.git", "./a.git", "a.git", "dir/with:colon"):
        assert is_local_url(url), url
    for url in ("https://h/a.git", "ssh://h/a.git", "git@h:org/a.git", "h:a.git", "git://h/a"):
        assert not is_local_url(url), url


def test_offline_fails_clearly_for_what_was_never_fetched(upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(GitError, match="has no local mirror"):
        lock(upstream, cache, "main", offline=True)
    lock(upstream, cache, "main")
    git(upstream.path, "checkout", "-q", "-b", "later")
    (upstream.path / "later.txt").write_text("later\n")
    later = commit_all(upstream.path, "later")
    with pytest.raises(
        GitError,
        match=r"rev 'later' is not a branch, tag or commit of the "
        r"local mirror of file://.* \(offline\)",
    ):
        lock(upstream, cache, "later", offline=True)
    with pytest.raises(GitError, match=rf"commit {later} is not in the local mirror"):
        lock(upstream, cache, later, offline=True)
    pin = lock(upstream, tmp_path / "other", "later")
    with pytest.raises(GitError, match=r"not in the local mirror \(offline\)"):
        export_source(pin, cache, tmp_path / "dest", offline=True)


# ----------------------------------------------------------------------------- submodules


@dataclass
class Nested:
    """parent → vendor/lib (a relative URL, ../lib) → deep (an absolute file:// URL)."""

    root: Path  # the folder holding parent/, lib/ and deep/
    parent: str  # parent's commit
    lib: str
    deep: str


@pytest.fixture
def nested(tmp_path: Path) -> Nested:
    root = tmp_path / "repos"
    commits = {}
    for name in ("deep", "lib", "parent"):
        repo = root / name
        repo.mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        (repo / f"{name}.txt").write_text(f"{name}\n")
        if name == "lib":
            git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", (root / "deep").as_uri(), "deep")
        if name == "parent":
            git(
                repo,
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                (root / "lib").as_uri(),
                "vendor/lib",
            )
            git(repo, "config", "-f", ".gitmodules", "submodule.vendor/lib.url", "../lib")
        commits[name] = commit_all(repo, name)
    return Nested(root, commits["parent"], commits["lib"], commits["deep"])


def recursive_checkout_hash(url: str, commit: str, tmp_path: Path) -> str:
    """content_hash of ``git clone --recurse-submodules`` at ``commit`` without git's files."""
    work = tmp_path / "recursive"
    git(tmp_path, "-c", "protocol.file.allow=always", "clone", "-q", url, str(work))
    git(work, "checkout", "-q", commit)
    git(work, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init", "--recursive")
    for path in sorted(work.rglob(".git"), key=lambda p: -len(p.parts)):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return content_hash(work)


def test_submodules_are_pinned_recursively_and_hashed_with_the_tree(nested: Nested, tmp_path: Path) -> None:
    url = (nested.root / "parent").as_uri()
    pin = lock_source(Source(repo=url, rev="main"), tmp_path / "cache")
    assert pin.commit == nested.parent
    assert [(m.path, m.url, m.commit) for m in pin.submodules] == [
        ("vendor/lib", (nested.root / "lib").as_uri(), nested.lib),
        ("vendor/lib/deep", (nested.root / "deep").as_uri(), nested.deep),
    ]
    assert pin.tree == recursive_checkout_hash(url, nested.parent, tmp_path)

    # realized offline from the mirrors alone, the upstreams gone
    shutil.rmtree(nested.root)
    dest = tmp_path / "store" / "parent"
    export_source(pin, tmp_path / "cache", dest, offline=True)
    assert (dest / "vendor" / "lib" / "deep" / "deep.txt").read_text() == "deep\n"
    assert not (dest / "vendor" / "lib" / ".git").exists()
    with pytest.raises(GitError, match="no local mirror"):
        export_source(
            dataclasses.replace(
                pin, submodules=(*pin.submodules, dataclasses.replace(pin.submodules[0], url="file:///nowhere/x"))
            ),
            tmp_path / "cache",
            tmp_path / "store" / "other",
            offline=True,
        )


def test_a_changed_submodule_commit_changes_the_tree(nested: Nested, tmp_path: Path) -> None:
    url = (nested.root / "parent").as_uri()
    before = lock_source(Source(repo=url, rev="main"), tmp_path / "cache")
    lib = nested.root / "lib"
    (lib / "lib.txt").write_text("lib two\n")
    commit_all(lib, "lib two")
    parent = nested.root / "parent"
    git(parent / "vendor" / "lib", "-c", "protocol.file.allow=always", "pull", "-q", "origin", "main")
    after_commit = commit_all(parent, "bump lib")
    after = lock_source(Source(repo=url, rev="main"), tmp_path / "cache")
    assert after.commit == after_commit
    assert after.submodules[0].commit != before.submodules[0].commit
    assert after.tree != before.tree


def test_git_mirrors_fetch_from_the_mirror_and_keep_the_canonical_url(nested: Nested, tmp_path: Path) -> None:
    canonical = "https://git.example.invalid/org/parent"
    mirrors = {"https://git.example.invalid/org/": nested.root.as_uri() + "/"}
    # The parent names its submodule relatively, so it is https://git.example.invalid/org/lib too.
    pin = lock_source(Source(repo=canonical, rev="main"), tmp_path / "cache", mirrors=mirrors)
    assert pin.repo == canonical and pin.commit == nested.parent
    assert pin.submodules[0].url == "https://git.example.invalid/org/lib"
    assert pin.submodules[1].url == (nested.root / "deep").as_uri()  # absolute in .gitmodules
    dest = tmp_path / "out"
    export_source(pin, tmp_path / "fresh-cache", dest, offline=False, mirrors=mirrors)
    assert content_hash(dest) == pin.tree
    with pytest.raises(GitError, match="cannot fetch"):
        lock_source(Source(repo=canonical, rev="main"), tmp_path / "cache2")


def test_fetch_url_and_join_url() -> None:
    from harness.resolve.git import fetch_url, join_url

    mirrors = {"https://h/a/x": "file:///m/x.git", "https://h/": "file:///m/", "https://h/a/": "ssh://m/a/"}
    assert fetch_url("https://h/a/x", mirrors) == "file:///m/x.git"
    assert fetch_url("https://h/a/y", mirrors) == "ssh://m/a/y"
    assert fetch_url("https://h/b", mirrors) == "file:///m/b"
    assert fetch_url("https://other/b", mirrors) == "https://other/b"
    assert join_url("https://h/org/parent.git", "../lib.git") == "https://h/org/lib.git"
    assert join_url("https://h/org/parent", "./sub") == "https://h/org/parent/sub"
    assert join_url("git@h:org/parent", "../lib") == "git@h:org/lib"
    assert join_url("https://h/org/parent", "https://x/y") == "https://x/y"


# ------------------------------------------------------------------- export: the same bytes

#: content_hash of the ``golden`` fixture's commit, as exported by every harness version so
#: far (the first ones wrote each blob from ``git cat-file``): locks record it, so an export
#: that writes other bytes, modes or symlinks would make every existing lock fail realize.
GOLDEN_TREE = "blake3:646d70615b2ade90727829dfc5a000c30a1718b3dc530a4ea78e1b3c4caf5237"


def _golden(root: Path) -> str:
    """parent (executables, symlinks, nested folders, bytes that .gitattributes would convert
    on checkout) with a submodule ``vendor/sub`` (a relative URL, so .gitmodules' bytes do not
    depend on where the test runs) holding an executable, a symlink and a nested file."""
    sub = root / "sub"
    (sub / "tools").mkdir(parents=True)
    git(sub, "init", "-q", "-b", "main")
    (sub / "tools" / "run").write_text("#!/bin/sh\necho sub\n")
    (sub / "tools" / "run").chmod(0o755)
    (sub / "tools" / "deep").mkdir()
    (sub / "tools" / "deep" / "data.txt").write_bytes(b"line\r\nline\n")
    (sub / "run-link").symlink_to("tools/run")
    commit_all(sub, "sub")
    parent = root / "parent"
    (parent / "a" / "b" / "c").mkdir(parents=True)
    git(parent, "init", "-q", "-b", "main")
    (parent / "a" / "b" / "c" / "deep.py").write_text("DEEP = 1\n")
    (parent / "a" / "b" / "empty").write_bytes(b"")
    (parent / "bin").mkdir()
    (parent / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (parent / "bin" / "tool").chmod(0o755)
    (parent / "bin" / "plain").write_text("not executable\n")
    (parent / "crlf.txt").write_bytes(b"one\r\ntwo\n")
    (parent / "ident.txt").write_text("$Id$\n")
    (parent / "model.bin").write_bytes(b"version https://git-lfs.github.com/spec/v1\nsize 3\n")
    (parent / "to-deep").symlink_to("a/b/c/deep.py")
    (parent / "a" / "up").symlink_to("../bin")
    (parent / "dangling").symlink_to("nowhere/at/all")
    git(parent, "-c", "protocol.file.allow=always", "submodule", "add", "-q", sub.as_uri(), "vendor/sub")
    git(parent, "config", "-f", ".gitmodules", "submodule.vendor/sub.url", "../sub")
    commit_all(parent, "files")
    # Attributes that would change the bytes on checkout, committed after the files (so
    # that committing them normalized nothing): eol conversion, ident, a smudge filter.
    (parent / ".gitattributes").write_text("* text eol=crlf\nident.txt ident\nmodel.bin filter=lfs\n")
    git(parent, "add", ".gitattributes")  # that file alone: `add -A` would renormalize the rest
    git(parent, "commit", "-q", "-m", "attributes")
    return git(parent, "rev-parse", "HEAD")


def test_export_writes_the_bytes_locks_already_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same tree hash as every earlier export, whatever the user's git config and umask:
    blobs as committed (no eol, ident or filter), modes, symlinks, nested folders, and a
    submodule at its pinned commit."""
    commit = _golden(tmp_path / "repos")
    url = (tmp_path / "repos" / "parent").as_uri()
    # A user's config that would change every one of those on a plain checkout.
    hostile = tmp_path / "gitconfig"
    hostile.write_text(
        "[core]\n\tautocrlf = true\n\tsymlinks = false\n\teol = crlf\n\tsparseCheckout = true\n"
        '[filter "lfs"]\n\tsmudge = tr a-z A-Z\n\trequired = true\n'
        "[checkout]\n\tworkers = 4\n\tthresholdForParallelism = 1\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(hostile))
    old_umask = os.umask(0o077)
    try:
        pin = lock_source(Source(repo=url, rev="main"), tmp_path / "cache")
        dest = tmp_path / "store" / "parent"
        export_source(pin, tmp_path / "cache", dest, offline=True)
    finally:
        os.umask(old_umask)
    assert pin.commit == commit
    assert [m.path for m in pin.submodules] == ["vendor/sub"]
    assert pin.tree == GOLDEN_TREE
    assert content_hash(dest) == GOLDEN_TREE
    assert (dest / "crlf.txt").read_bytes() == b"one\r\ntwo\n"
    assert (dest / "ident.txt").read_bytes() == b"$Id$\n"
    assert (dest / "model.bin").read_bytes().startswith(b"version https://git-lfs")
    assert (dest / "vendor" / "sub" / "tools" / "deep" / "data.txt").read_bytes() == b"line\r\nline\n"
    assert os.readlink(dest / "to-deep") == "a/b/c/deep.py"
    assert os.readlink(dest / "a" / "up") == "../bin"
    assert os.readlink(dest / "dangling") == "nowhere/at/all"
    assert os.readlink(dest / "vendor" / "sub" / "run-link") == "tools/run"
    for executable in ("bin/tool", "vendor/sub/tools/run"):
        assert os.stat(dest / executable).st_mode & 0o777 == 0o755
    for plain in ("bin/plain", "a/b/empty", ".gitmodules", "vendor/sub/tools/deep/data.txt"):
        assert os.stat(dest / plain).st_mode & 0o777 == 0o644
    assert not (dest / ".git").exists() and not (dest / "vendor" / "sub" / ".git").exists()


def test_lock_can_keep_the_files_it_hashed(upstream: Upstream, tmp_path: Path) -> None:
    """``keep``: the lock's one export stays, the same files a later export writes."""
    cache = tmp_path / "cache"
    kept = tmp_path / "scratch" / "kept"
    kept.parent.mkdir()
    pin = lock_source(Source(repo=upstream.url, rev="main"), cache, keep=kept)
    assert content_hash(kept) == pin.tree == lock(upstream, cache, "main").tree
    assert os.readlink(kept / "link") == "README" and os.access(kept / "bin" / "tool", os.X_OK)
    with pytest.raises(GitError, match="already exists"):
        lock_source(Source(repo=upstream.url, rev="main"), cache, keep=kept)
    with pytest.raises(GitError, match="subdirectory 'nope' does not exist"):
        lock_source(Source(repo=upstream.url, rev="main", subdirectory="nope"), cache, keep=tmp_path / "k2")
    assert not (tmp_path / "k2").exists()


def test_a_malformed_tree_is_refused_before_anything_is_written(upstream: Upstream, tmp_path: Path) -> None:
    """A tree (made with mktree, as no checkout would) that holds a file and a folder of the
    same name: writing both would put the folder's files where the file is."""
    blob = git(upstream.path, "rev-parse", "HEAD:README")
    inner = git(upstream.path, "mktree", input_text=f"100644 blob {blob}\tb\n")
    tree = git(upstream.path, "mktree", input_text=f"100644 blob {blob}\ta\n040000 tree {inner}\ta\n")
    commit = git(upstream.path, "commit-tree", tree, "-m", "malformed")
    git(upstream.path, "update-ref", "refs/heads/malformed", commit)
    with pytest.raises(GitError, match="malformed tree: 'a' collides"):
        lock(upstream, tmp_path / "cache", "malformed")
