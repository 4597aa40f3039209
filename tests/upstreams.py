"""Local upstreams shared by the lock and realize tests: one package index, one hub server
and one ``file://`` git repository per test module, with the environment pointing harness
(and the hub clients, and git) at them, plus a project that uses all of them."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.store.hashing import content_hash
from tests.conftest import REPO
from tests.hubserver import HubServer
from tests.localindex import LocalIndex, publish_standard, write_source_tree

STORE = re.compile(r"^[0-9a-df-np-sv-z]{32}-[A-Za-z0-9+._?=-]+$")  # Nix base32, then a name
IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}
HF_FILES = {
    "config.json": b'{"hidden_size": 8}\n',
    "model.safetensors": os.urandom(50_000),
    "tokenizer/vocab.txt": b"a\nb\n",
    "README.md": b"# not included\n",
}
MS_FILES = {"weights.bin": os.urandom(20_000), "configuration.json": b"{}\n"}
LOCAL_FILES = {"arm.json": b'{"dof": 7}\n', "meshes/link0.stl": b"solid link0\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **IDENTITY}
    )
    return result.stdout.strip()


# --------------------------------------------------------------------------------- fixtures


@dataclass
class Upstreams:
    index: LocalIndex
    hub: HubServer
    repo_url: str  # file:// git repository holding a Python project (toolkit)
    commit: str  # what tag v1 names
    tree: str  # content hash of that commit's files
    hf_commit: str
    ms_commit: str
    home: Path  # the module's shared HARNESS_HOME (warm caches)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    """One index, one hub server and one git repository for the whole module, with the
    environment pointing harness (and the hub clients, and git) at them."""
    base = tmp_path_factory.mktemp("upstreams")
    index = publish_standard(LocalIndex(base / "index"))
    index.add_wheel("tinybuild", "1.0")  # the git source's build requirement
    # A stand-in for the kinematics example's one requirement, with its real file name.
    index.add_wheel("numpy", "2.2.6", tag="cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")

    repo = base / "toolkit"
    write_source_tree(repo, "toolkit", "0.1", requires=["beta"])
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("requires = []", 'requires = ["tinybuild>=1.0"]'))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIT_CONFIG_GLOBAL", os.devnull)
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "toolkit 0.1")
        git(repo, "tag", "v1")
        commit = git(repo, "rev-parse", "HEAD")
        (repo / "CHANGES").write_text("after v1\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "later")
        checkout = base / "checkout"
        git(base, "clone", "-q", str(repo), str(checkout))
        git(checkout, "checkout", "-q", commit)
        shutil.rmtree(checkout / ".git")
        tree = content_hash(checkout)

        with index, HubServer() as hub:
            hub.hf_commit("org/model", {"config.json": b"old"})
            hf_commit = hub.hf_commit("org/model", HF_FILES)
            ms_commit = hub.ms_commit("org/ms-model", MS_FILES, tag="v1.0")
            hub.ms_commit("org/ms-model", {**MS_FILES, "weights.bin": b"newer on master"})
            home = base / "home"
            for key, value in {
                "HARNESS_HOME": str(home),
                "HARNESS_INDEX_PYPI": index.url,
                "HF_ENDPOINT": hub.url,
                "HARNESS_MODELSCOPE_ENDPOINT": hub.url,
                "MODELSCOPE_ENDPOINT": hub.url,
                "HF_HOME": str(base / "hf-home"),
                "MODELSCOPE_CACHE": str(base / "ms-cache"),
                "MODELSCOPE_HOME": str(base / "ms-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }.items():
                mp.setenv(key, value)
            for name in (
                "HF_TOKEN",
                "HUGGING_FACE_HUB_TOKEN",
                "MODELSCOPE_API_TOKEN",
                "HF_HUB_OFFLINE",
                "UV_DEFAULT_INDEX",
                "UV_INDEX_URL",
                "HARNESS_DEPLOY",
            ):
                mp.delenv(name, raising=False)
            for name in os.environ:  # no index of this machine's configuration may leak in
                if name.startswith("HARNESS_INDEX_") and name != "HARNESS_INDEX_PYPI":
                    mp.delenv(name)
            yield Upstreams(index, hub, repo.as_uri(), commit, tree, hf_commit, ms_commit, home)


def service(requirements: list[str], *, extra: str = "") -> str:
    """A minimal service manifest; ``extra`` is appended TOML ([[weights]], sources, …)."""
    reqs = ", ".join(f'"{r}"' for r in requirements)
    return (
        'kind = "tester"\nsummary = "a test service"\ncommand = ["{python}", "-c", "pass"]\n'
        f'port = 9000\n\n[environment]\npython = "3.11"\nrequirements = [{reqs}]\n{extra}'
    )


def make_project(root: Path, manifests: dict[str, str], files: dict[str, bytes] | None = None) -> Path:
    """A project folder: the repository's harness.toml (lock target and interpreter pin),
    ``services/<name>.toml`` for each manifest, and any other files."""
    (root / "services").mkdir(parents=True)
    shutil.copy(REPO / "harness.toml", root / "harness.toml")
    for name, text in manifests.items():
        (root / "services" / f"{name}.toml").write_text(text)
    for rel, data in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def svc_manifest(up: Upstreams) -> str:
    return service(
        ["gamma==1.0", "delta==1.0"],
        extra=f"""
[[environment.sources]]
repo = "{up.repo_url}"
rev = "v1"
install = "editable"

[[weights]]
dir = "hf"
huggingface_model = "org/model"
include = ["*.json", "*.safetensors", "tokenizer/"]

[[weights]]
dir = "ms"
modelscope_model = "org/ms-model"
revision = "v1.0"

[[weights]]
dir = "local"
path = "assets/local"
""",
    )


@pytest.fixture(scope="module")
def svc(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with a git source, hub weights and a path weight, locked once (read-only)."""
    from harness.cli import main

    root = make_project(
        tmp_path_factory.mktemp("svc"),
        {"svc": svc_manifest(up)},
        {f"assets/local/{k}": v for k, v in LOCAL_FILES.items()},
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--project", str(root), "lock"])
    assert exit_.value.code == 0
    return root
