"""The project's own service and benchmark code, registered as store paths.

A manifest's ``command`` (or a benchmark's ``worker``) may name files of the project by
relative path (``services/servers/serve_kinematics.py``). Invariant 1 says nothing launches
from a mutable checkout, so the runtime asks this module for a content-addressed store path
holding those files and launches from it instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def service_files(project_root: Path, argv: list[str]) -> list[Path]:
    """Files and folders of the project that a command names by relative path
    (``services/servers/serve_kinematics.py``): code that must run from the store too."""
    found: list[Path] = []
    root = project_root.resolve()
    for part in argv:
        if "{" in part or part.startswith("-") or Path(part).is_absolute():
            continue
        candidate = project_root / part
        if candidate.exists() and candidate.resolve().is_relative_to(root):
            found.append(candidate)
    return found


def realize_project_files(store: Any, project_root: Path, name: str, files: list[Path]) -> str:
    """Register ``files`` (at their project-relative paths) as one content-addressed store
    path and return its name. The path is fixed by the files' content (like a git source),
    so the same code is the same path in every home, and a changed file is a new path."""
    import shutil
    import tempfile

    from harness.store.hashing import content_hash, sanitize_name, store_hash, store_path_name
    from harness.store.store import BuildResult

    def stage(out: Path) -> None:
        out.mkdir()
        for file in files:
            rel = file.relative_to(project_root)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            if file.is_dir():
                shutil.copytree(file, out / rel, symlinks=False)
            else:
                shutil.copy2(file, out / rel)

    with tempfile.TemporaryDirectory(prefix="harness-code-") as scratch:
        staged = Path(scratch) / "out"
        stage(staged)
        tree = content_hash(staged)
    label = sanitize_name(name)
    path = store_path_name(store_hash("source", label, {"tree": tree}), label)

    def build(out: Path) -> BuildResult:
        stage(out)
        return BuildResult(obtained=f"project files {', '.join(str(f.relative_to(project_root)) for f in files)}")

    store.add(path, "source", build, expected_content=tree)
    return path
