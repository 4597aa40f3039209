"""The no-op re-lock (harness.lock.stamp) and uv runs started ahead (harness.lock.early).

How a test tells that the resolver did not run: after a lock, the local index gains another
wheel of the pinned version that fits the target. A resolution lists every fitting wheel, so
a lock that resolved names the new file, and one answered from the stamp does not. Each
change of an input must therefore bring the newest wheel into the lock, and each re-lock
with nothing changed must leave the lock's bytes as they were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.localindex import LocalIndex
from tests.upstreams import Upstreams, make_project, service

#: Runs the CLI, then says which modules it loaded: the resolvers are in harness.resolve.
PROBE = """
import sys
from harness.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules if m == "pydantic" or m.startswith("harness.resolve"))
print("loaded:", ",".join(loaded), file=sys.stderr)
sys.exit(code)
"""


class Index:
    """A local index whose ``alpha 1.0`` gains one more fitting wheel on each :meth:`grow`."""

    def __init__(self, index: LocalIndex) -> None:
        self.index = index
        # Tags a resolution for CPython 3.11 on x86_64-manylinux_2_28 takes.
        self.tags = iter(
            f"{python}-none-manylinux_2_{glibc}_x86_64"
            for python in ("py3", "py311", "cp311")
            for glibc in range(5, 29)
        )
        index.add_wheel("alpha", "1.0")
        index.add_wheel("beta", "1.0")

    def grow(self) -> str:
        """Add a wheel of alpha 1.0 that a resolution would list; its file name."""
        return self.index.add_wheel("alpha", "1.0", tag=next(self.tags)).name


@pytest.fixture
def index(up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    with LocalIndex(tmp_path / "index") as local:
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        yield Index(local)


def wheels(lock: Path) -> list[str]:
    data = tomllib.loads(lock.read_text())
    return [w["file"] for p in data["packages"] if p["name"] == "alpha" for w in p["wheels"]]


def lock(harness_cli, project: Path, home: Path, *args: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """``harness lock --json ARGS``; each manifest's entry by name."""
    result = harness_cli("--home", str(home), "--project", str(project), "lock", "--json", *args)
    assert result.code == 0, result.err
    return {entry["name"]: entry for entry in json.loads(result.out)["locks"]}


def probe(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, "--home", str(home), "--project", str(project), "lock", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_relock_with_no_input_changed_does_not_resolve(
    index: Index, harness_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    project = make_project(tmp_path / "p", {"svc": service(["alpha"]), "other": service(["beta"])})
    svc = project / "locks" / "svc.lock.toml"
    first = lock(harness_cli, project, home)
    assert all(e["changed"] and e["resolved"] for e in first.values())
    locked = svc.read_bytes()

    # Nothing changed: answered from the stamp, the index not asked (its new wheel unseen),
    # the lock's bytes untouched, and neither pydantic nor any resolver loaded.
    new = index.grow()
    again = lock(harness_cli, project, home)
    assert [(e["changed"], e["resolved"]) for e in again.values()] == [(False, False)] * 2
    assert again["svc"]["environment"] == first["svc"]["environment"]
    assert svc.read_bytes() == locked and new not in wheels(svc)
    result = probe(project, home)
    assert result.returncode == 0, result.stderr
    assert "unchanged svc (locks/svc.lock.toml)" in result.stderr
    assert "loaded: \n" in result.stderr, result.stderr

    # --refresh resolves all the same, and keeps the pins.
    assert lock(harness_cli, project, home, "--refresh")["svc"]["resolved"]
    assert new in wheels(svc)

    def resolves(change, *args: str, name: str = "svc") -> None:  # type: ignore[no-untyped-def]
        """After ``change()``, the lock resolves again (and sees a new wheel); the lock after
        that is a no-op again."""
        change()
        new = index.grow()
        entries = lock(harness_cli, project, home, *args)
        assert entries[name]["resolved"], (change, args)
        assert new in wheels(project / "locks" / f"{name}.lock.toml"), (change, args)
        unseen = index.grow()
        assert not lock(harness_cli, project, home)[name]["resolved"]
        assert unseen not in wheels(project / "locks" / f"{name}.lock.toml")

    manifest = project / "services" / "svc.toml"
    resolves(lambda: manifest.write_text(manifest.read_text() + "# a comment\n"))
    resolves(lambda: svc.write_text(svc.read_text().replace(wheels(svc)[0], "edited.whl")))
    resolves(svc.unlink)
    settings = project / "harness.toml"
    resolves(lambda: settings.write_text(settings.read_text() + '\n[indexes]\nlab = "http://lab.invalid/simple"\n'))
    resolves(lambda: (home / "config.toml").write_text('[hubs]\nhuggingface = "http://hub.invalid"\n'))
    resolves(lambda: monkeypatch.setenv("UV_HTTP_TIMEOUT", "123"))
    resolves(lambda: monkeypatch.setenv("HARNESS_INDEX_LAB", "http://lab.invalid/other"))
    resolves(lambda: None, "--upgrade-package", "alpha")
    resolves(lambda: None, "--upgrade")
    resolves(lambda: None, "--refresh", "svc")
    # --platform locks for that platform this once: that lock and the plain one after it
    # resolve (the same target here, so the same bytes), then the plain one is a no-op.
    assert lock(harness_cli, project, home, "--platform", "x86_64-manylinux_2_28")["svc"]["resolved"]
    resolves(lambda: None)

    # Only the edited manifest resolves; the other one's stamp still holds.
    other = project / "services" / "other.toml"
    other.write_text(other.read_text().replace('"beta"', '"beta", "alpha"'))
    new = index.grow()
    entries = lock(harness_cli, project, home)
    assert (entries["other"]["changed"], entries["other"]["resolved"]) == (True, True)
    assert (entries["svc"]["changed"], entries["svc"]["resolved"]) == (False, False)
    assert new in wheels(project / "locks" / "other.lock.toml") and new not in wheels(svc)

    # A broken manifest is still reported, stamps or not.
    (project / "services" / "broken.toml").write_text("kind = 1\n")
    result = harness_cli("--home", str(home), "--project", str(project), "lock", "svc")
    assert result.code == 2 and "broken.toml" in result.err


def test_path_weights_are_inputs(index: Index, harness_cli, tmp_path: Path) -> None:
    extra = '\n[[weights]]\ndir = "local"\npath = "assets/local"\n'
    project = make_project(
        tmp_path / "p", {"svc": service(["alpha"], extra=extra)}, {"assets/local/arm.json": b'{"dof": 7}\n'}
    )
    home = tmp_path / "home"
    svc = project / "locks" / "svc.lock.toml"
    assert lock(harness_cli, project, home)["svc"]["resolved"]
    # A file changed in the last two seconds gives no stamp (its stat could change unseen).
    assert lock(harness_cli, project, home)["svc"]["resolved"]
    time.sleep(2.1)
    assert lock(harness_cli, project, home)["svc"]["resolved"]
    assert not lock(harness_cli, project, home)["svc"]["resolved"]

    arm = project / "assets" / "local" / "arm.json"
    before = arm.stat()
    arm.write_bytes(b'{"dof": 6}\n')  # same size, mtime put back: ctime still tells
    os.utime(arm, ns=(before.st_atime_ns, before.st_mtime_ns))
    entry = lock(harness_cli, project, home)["svc"]
    assert (entry["changed"], entry["resolved"]) == (True, True)
    assert "arm.json" in svc.read_text()
    (project / "assets" / "local" / "new.bin").write_bytes(b"more")
    assert lock(harness_cli, project, home)["svc"]["changed"]
    assert "new.bin" in svc.read_text()


def test_moving_refs_always_resolve(up: Upstreams, harness_cli, tmp_path: Path) -> None:
    """A git source at a branch or tag can move upstream without any local change: its
    manifest resolves on every lock (and follows the move). At a commit it cannot."""

    def source(rev: str) -> str:
        return service(
            ["alpha==1.0"],
            extra=f'\n[[environment.sources]]\nrepo = "{up.repo_url}"\nrev = "{rev}"\ninstall = "none"\n',
        )

    project = make_project(tmp_path / "p", {"tagged": source("v1"), "pinned": source(up.commit)})
    home = tmp_path / "home"
    lock(harness_cli, project, home)
    entries = lock(harness_cli, project, home)
    assert (entries["tagged"]["changed"], entries["tagged"]["resolved"]) == (False, True)
    assert (entries["pinned"]["changed"], entries["pinned"]["resolved"]) == (False, False)


def test_a_run_started_ahead_is_taken_over_only_by_the_same_run(up: Upstreams, tmp_path: Path) -> None:
    from harness.resolve.uvtool import discard_prestarted, prestart, prestarted_count, run_uv, uv_version

    work = tmp_path / "work"
    work.mkdir()
    compile = ["pip", "compile", "requirements.in", "-o", "out.txt", "--quiet", "--default-index", up.index.url]
    uv_version.cache_clear()
    try:
        prestart(["--version"])
        prestart([*compile], cache_dir=tmp_path / "cache", files={"requirements.in": "alpha\n"})
        assert prestarted_count() == 2
        assert run_uv(["--version"]).stdout.startswith("uv ")
        assert prestarted_count() == 1
        # Other input bytes: not the same run, so uv runs again (and fails on its own terms).
        (work / "requirements.in").write_text("alpha==9\n")
        with pytest.raises(Exception, match="alpha"):
            run_uv(compile, cache_dir=tmp_path / "cache", cwd=work)
        assert prestarted_count() == 1
        # The same bytes: taken over, its output copied into the caller's folder.
        (work / "requirements.in").write_text("alpha\n")
        run_uv(compile, cache_dir=tmp_path / "cache", cwd=work)
        assert prestarted_count() == 0
        assert "alpha==" in (work / "out.txt").read_text()
        prestart(["--version"])
    finally:
        discard_prestarted()
    assert prestarted_count() == 0


def test_lock_starts_uv_before_validating_and_gives_the_same_lock(index: Index, harness_cli, tmp_path: Path) -> None:
    """The runs started from the raw manifest are the ones the validated path takes over,
    and the lock is the same bytes as one locked without them (another home, --refresh)."""
    from harness.config import load_settings
    from harness.lock.early import prestart_locks
    from harness.lock.generate import lock_project
    from harness.lock.outcome import LockOptions
    from harness.manifests.project import Project
    from harness.resolve.uvtool import discard_prestarted, prestarted_count, uv_version

    project = make_project(tmp_path / "p", {"svc": service(["alpha", "beta"]), "other": service(["beta"])})
    home = tmp_path / "home"
    assert load_settings(home, project).lock_platforms
    try:
        uv_version.cache_clear()
        assert prestart_locks(home, Project(project), [], LockOptions()) == 2
        assert prestarted_count() == 4  # and uv --version, uv python list
        outcomes = lock_project(
            Project(project), [], settings=load_settings(home, project), cache_dir=home / "cache", options=LockOptions()
        )
        assert all(o.changed and not o.error for o in outcomes)
        assert prestarted_count() == 0, "every run started ahead was taken over"
    finally:
        discard_prestarted()
    first = (project / "locks" / "svc.lock.toml").read_bytes()
    # Nothing is started for a manifest whose stamp holds: it will not be resolved.
    assert prestart_locks(home, Project(project), [], LockOptions()) == 0
    assert prestarted_count() == 0
    lock(harness_cli, project, tmp_path / "other-home", "--refresh")
    assert (project / "locks" / "svc.lock.toml").read_bytes() == first
    # A previous lock's pins are guessed too (preferences), and still taken over.
    try:
        assert prestart_locks(home, Project(project), ["svc"], LockOptions(refresh=True)) == 1
        lock_project(
            Project(project),
            ["svc"],
            settings=load_settings(home, project),
            cache_dir=home / "cache",
            options=LockOptions(refresh=True),
        )
        assert prestarted_count() == 0
    finally:
        discard_prestarted()
    assert (project / "locks" / "svc.lock.toml").read_bytes() == first
    # Nothing is started for what validation refuses: uv never sees a URL or a path first.
    for bad in (["alpha @ file:///nowhere/alpha-1.0-py3-none-any.whl"], ["./alpha"], ["alpha", "../beta"]):
        (project / "services" / "bad.toml").write_text(service(bad))
        assert prestart_locks(home, Project(project), ["bad"], LockOptions()) == 0
    (project / "services" / "bad.toml").write_text(service(["beta==1.0"]))
    try:
        assert prestart_locks(home, Project(project), ["bad"], LockOptions()) == 1
    finally:
        discard_prestarted()


def test_what_moves_upstream() -> None:
    """Pure: the manifests that never get a stamp, and those that do."""
    from harness.lock.stamp import moving_inputs
    from harness.manifests.loading import parse_toml, validate_data
    from harness.manifests.model import ServiceManifest

    commit = "0123456789abcdef0123456789abcdef01234567"

    def moving(extra: str) -> list[str]:
        return moving_inputs(validate_data(ServiceManifest, parse_toml(service(["alpha"], extra=extra), "t"), "t"))

    assert moving("") == []
    assert moving(f'[[environment.sources]]\nrepo = "file:///r"\nrev = "{commit}"\n') == []
    assert moving('[[environment.sources]]\nrepo = "file:///r"\nrev = "main"\n') == ["source file:///r at main"]
    assert moving(f'[[weights]]\ndir = "m"\nhuggingface_model = "o/m"\nrevision = "{commit}"\n') == []
    assert moving('[[weights]]\ndir = "m"\nhuggingface_model = "o/m"\n') == ["weights m at the default branch"]
    assert moving('[[weights]]\ndir = "m"\nmodelscope_model = "o/m"\nrevision = "v1.0"\n') == ["weights m at v1.0"]
    assert moving('[[weights]]\ndir = "u"\nurl = "https://example.invalid/w.bin"\n') == [
        "weights u (a url without sha256)"
    ]
    assert moving(f'[[weights]]\ndir = "u"\nurl = "https://example.invalid/w.bin"\nsha256 = "{"0" * 64}"\n') == []
    assert moving('[[weights]]\ndir = "p"\npath = "assets"\n') == []


def test_a_lock_that_fails_after_uv_started_early_stops_it_and_leaves_no_folder(index: Index, tmp_path: Path) -> None:
    """A uv run started from the raw manifest that the validated path never takes over (the
    manifest fails validation after it started) is stopped and its folder removed, and the
    error is the CLI's own, with its status."""
    from harness.lock.early import prestart_locks
    from harness.lock.outcome import LockOptions
    from harness.manifests.project import Project
    from harness.resolve.uvtool import discard_prestarted

    project = make_project(tmp_path / "p", {"svc": service(["alpha"])})
    manifest = project / "services" / "svc.toml"
    manifest.write_text("not-a-key = 1\n" + manifest.read_text())  # the raw TOML read ignores it
    try:
        assert prestart_locks(tmp_path / "home", Project(project), [], LockOptions()) == 1, "uv starts for it"
    finally:
        discard_prestarted()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    argv = ["--home", str(tmp_path / "home"), "--project", str(project), "lock"]
    result = subprocess.run(
        [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode != 0 and "not-a-key" in result.stderr, result
    assert "Traceback" not in result.stderr
    assert [p.name for p in scratch.iterdir() if p.name.startswith("harness-early-uv-")] == []


def test_check_answers_from_the_stamp_and_takes_the_full_path_on_any_change(
    index: Index, harness_cli, tmp_path: Path
) -> None:
    """``lock --check`` right after a lock: up to date without loading pydantic; after a change
    the stamp does not cover, the full check decides (and names the stale lock)."""
    home = tmp_path / "home"
    project = make_project(tmp_path / "p", {"svc": service(["alpha"]), "other": service(["beta"])})
    lock(harness_cli, project, home)
    result = probe(project, home, "--check")
    assert (result.returncode, result.stdout.strip()) == (0, "every lock is up to date"), result.stderr
    assert "loaded: \n" in result.stderr, result.stderr

    # Another home has no stamps: the full check, the same answer.
    result = probe(project, tmp_path / "other-home", "--check")
    assert (result.returncode, result.stdout.strip()) == (0, "every lock is up to date"), result.stderr
    assert "pydantic" in result.stderr

    manifest = project / "services" / "svc.toml"
    manifest.write_text(manifest.read_text().replace('"alpha"', '"alpha", "beta"'))
    result = probe(project, home, "--check")
    assert result.returncode == 1
    assert "stale  svc: manifest changed (locks/svc.lock.toml)" in result.stdout
    assert "other" not in result.stdout
