"""The project's own service and benchmark code, registered as store paths.

A manifest's ``command`` (or a benchmark's ``worker``) may name files of the project by
relative path (``services/servers/serve_kinematics.py``). Invariant 1 says nothing launches
from a mutable checkout, so the runtime asks this module for a content-addressed store path
holding those files and launches from it instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.manifests.model import BenchmarkManifest
    from harness.store.store import Store


def service_files(project_root: Path, argv: list[str]) -> list[Path]:
    """Files and folders of the project that a command names by relative path
    (``services/servers/serve_kinematics.py``): code that must run from the store too."""
    return [project_root / argv[i] for i in project_file_parts(project_root, argv)]


def project_file_parts(project_root: Path, argv: list[str]) -> list[int]:
    """The indices of ``argv`` that name a file or folder of the project by relative path
    (those :func:`service_files` registers): a process that does not start in the store copy
    of those files must be given them as absolute paths."""
    found: list[int] = []
    root = project_root.resolve()
    for index, part in enumerate(argv):
        if "{" in part or part.startswith("-") or Path(part).is_absolute():
            continue
        candidate = project_root / part
        if candidate.exists() and candidate.resolve().is_relative_to(root):
            found.append(index)
    return found


def _stage(project_root: Path, files: list[Path], out: Path) -> None:
    import shutil

    out.mkdir()
    for file in files:
        rel = file.relative_to(project_root)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        if file.is_dir():
            shutil.copytree(file, out / rel, symlinks=False)
        else:
            shutil.copy2(file, out / rel)


def project_code_path(project_root: Path, name: str, files: list[Path]) -> tuple[str, str]:
    """(store path name, content hash) the ``files`` would be registered as; reads them,
    writes nothing outside a temporary folder. ``store gc`` uses it to keep the code the
    current checkout would launch."""
    import tempfile

    from harness.store.hashing import content_hash, sanitize_name, store_hash, store_path_name

    with tempfile.TemporaryDirectory(prefix="harness-code-") as scratch:
        staged = Path(scratch) / "out"
        _stage(project_root, files, staged)
        tree = content_hash(staged)
    label = sanitize_name(name)
    return store_path_name(store_hash("source", label, {"tree": tree}), label), tree


def checkout_code_paths(project_root: Path) -> dict[str, str]:
    """Manifest name -> the code store path the checkout's manifests would launch now.

    Reads only each manifest's ``command`` (services) or ``worker`` (benchmarks) with
    tomllib, so a manifest that no longer validates still keeps its code; a manifest that
    cannot be read at all is skipped.
    """
    import tomllib

    found: dict[str, str] = {}
    for folder, key in (("services", "command"), ("benchmarks", "worker")):
        for manifest in sorted((project_root / folder).glob("*.toml")):
            try:
                argv = tomllib.loads(manifest.read_text(encoding="utf-8")).get(key)
            except (OSError, ValueError):
                continue
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                continue
            files = service_files(project_root, argv)
            if files:
                try:
                    found[manifest.stem] = project_code_path(project_root, f"{manifest.stem}-code", files)[0]
                except (OSError, ValueError):
                    continue
    return found


def realize_project_files(store: Store, project_root: Path, name: str, files: list[Path]) -> str:
    """Register ``files`` (at their project-relative paths) as one content-addressed store
    path and return its name. The path is fixed by the files' content (like a git source),
    so the same code is the same path in every home, and a changed file is a new path.

    The path is rooted for this process before it is looked up (it cannot be collected
    while the caller uses it), and the project's gc root remembers it as the code of
    ``name``, so ``store gc`` keeps it even after the project folder moves.
    """
    from harness.store.gc import remember_code
    from harness.store.roots import hold
    from harness.store.store import BuildResult

    path, tree = project_code_path(project_root, name, files)
    hold(store, [path])

    def build(out: Path) -> BuildResult:
        _stage(project_root, files, out)
        return BuildResult(obtained=f"project files {', '.join(str(f.relative_to(project_root)) for f in files)}")

    store.add(path, "source", build, expected_content=tree)
    remember_code(store, project_root, name, path)
    return path


def benchmark_worker_code(
    store: Store, project_root: Path, benchmark: str | None, manifest: BenchmarkManifest | None
) -> str | None:
    """The store path of the project files a benchmark's ``worker`` names (registered here),
    or None when it names none: the worker, like a service, runs its own code from the store.
    Shared by a local run and a cluster run's head, so both record the same code path."""
    if benchmark is None or manifest is None:
        return None
    files = service_files(project_root, list(manifest.worker or []))
    return realize_project_files(store, project_root, f"{benchmark}-code", files) if files else None
