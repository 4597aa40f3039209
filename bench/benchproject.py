"""Throw-away projects for the benchmarks: one service manifest per requirement set."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Requirement sets the lock and realize benches share (issue 17's medium and VLM-like sets).
MEDIUM = ["requests==2.32.3", "rich==13.9.4", "pydantic==2.9.2"]
#: A mid-size scientific set (issue 30: an environment of 290 MiB, 2,800 sources to compile).
SCIENTIFIC = ["numpy==2.1.3", "scipy==1.14.1", "pandas==2.2.3"]
VLM = [
    "transformers==4.57.1",
    "tokenizers==0.22.1",
    "pillow==11.3.0",
    "safetensors==0.6.2",
    "fastapi==0.118.0",
    "uvicorn==0.37.0",
]


def harness_command() -> list[str]:
    """This Python's ``harness`` (the checkout's install), else ``python -m harness``."""
    script = Path(sys.executable).with_name("harness")
    return [str(script)] if script.exists() else [sys.executable, "-m", "harness"]


def manifest(name: str, requirements: list[str]) -> str:
    """A minimal service manifest whose environment holds ``requirements``."""
    reqs = ", ".join(f'"{r}"' for r in requirements)
    return (
        f'kind = "{name}"\nsummary = "bench"\ncommand = ["{{python}}", "-c", "pass"]\nport = 9000\n\n'
        f'[environment]\npython = "3.11"\nrequirements = [{reqs}]\n'
    )


def make_project(root: Path, manifests: dict[str, list[str]]) -> Path:
    """A project at ``root`` with the repository's harness.toml (lock target, Python pin)."""
    (root / "services").mkdir(parents=True)
    shutil.copy(ROOT / "harness.toml", root / "harness.toml")
    for name, requirements in manifests.items():
        (root / "services" / f"{name}.toml").write_text(manifest(name, requirements))
    return root


def regular_install(where: Path) -> Path:
    """The ``harness`` command of a regular (not editable) install of this checkout in a new
    venv under ``where``, as a user's ``pip install`` leaves it: a wheel built from the working
    tree, installed with its bytecode compiled; its dependencies are the running venv's (a
    ``.pth`` line), so only the wheel's build system may come from the index.

    Why: ``scripts/bootstrap.sh`` installs harness editable, and setuptools' editable import
    finder runs at every interpreter start (it imports ``pathlib``, ``re``, ``urllib``…: 10–30 ms
    on two cores), which no user's install pays. Start-up-bound figures (the early verify, a
    small lock) are measured on both."""
    from harness.resolve.uvtool import uv_bin

    wheels, venv = where / "wheel", where / "venv"
    quiet = {"check": True, "stdout": subprocess.DEVNULL}
    # Built from a copy: a build in the checkout would leave build/ and *.egg-info there.
    source = where / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "node_modules", "__pycache__", "build", "dist", "*.egg-info", "weights"
        ),
    )
    # uv builds it with the build system pyproject.toml names (from uv's cache or the index).
    subprocess.run(
        [uv_bin(), "--no-config", "build", "--quiet", "--wheel", "--out-dir", str(wheels), str(source)], **quiet
    )
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **quiet)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            uv_bin(),
            "--no-config",
            "pip",
            "install",
            "--quiet",
            "--offline",
            "--no-deps",
            "--compile-bytecode",
            "--python",
            str(python),
            *map(str, wheels.glob("*.whl")),
        ],
        **quiet,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "_bench_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "harness"
