"""The seed's services lock and realize end to end, against local counterparts (issue 13).

The shipped ``services/*.toml`` and ``benchmarks/*.toml`` are used as they are, configured
through settings alone (``$HARNESS_HOME/config.toml``: index addresses, hub endpoints, a git
mirror for ``https://github.com/``, interpreter pins), with one unavoidable exception: a git
``rev`` that pins a real upstream commit is retargeted to the local counterpart's commit,
because a commit id is the hash of its content and no local repository can have it (the
test checks that the revs are the only difference). Counterparts:

* local git repositories shaped like SAM 3, OpenWAM (with a submodule), XPolicyLab (built
  by a backend that asks for ``editables`` dynamically, as hatchling does), IsaacLab (six
  packages under ``source/``), cuRobo and RoboDojo (with XPolicyLab, IsaacLab and cuRobo as
  submodules at canonical ``https://github.com/…`` URLs), reached through ``[git-mirrors]``;
* a default index of stand-in wheels for every pinned requirement, an index named
  ``pytorch-cu128`` (HTML only, like the real one) serving ``torch-2.7.1+cu128``,
  ``torchvision-0.22.1+cu128`` and the 2.7.0 set RoboDojo pins, and one named ``nvidia``
  serving ``isaacsim``;
* the local hub serving every model and the RoboDojo dataset repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.store.store import Store
from tests.conftest import REPO, run_harness_process
from tests.hubserver import HubServer
from tests.localindex import LocalIndex, write_source_tree
from tests.upstreams import git

DYNAMIC_EDITABLE = """

def get_requires_for_build_editable(config_settings=None):
    return ["editables>=0.3"]  # asked for dynamically, as hatchling does


_static_build_editable = build_editable


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    import editables  # noqa: F401 - only there if the lock pinned what the backend asked for
    return _static_build_editable(wheel_directory, config_settings, metadata_directory)
"""

#: Every requirement pin of the shipped manifests that the default index serves.
DEFAULT_INDEX = [
    ("torch", "2.7.0"),
    ("torch", "2.7.1"),
    ("torchvision", "0.22.0"),
    ("torchvision", "0.22.1"),
    ("transformers", "4.57.1"),
    ("transformers", "5.5.0"),
    ("accelerate", "1.10.1"),
    ("einops", "0.8.1"),
    ("pillow", "11.3.0"),
    ("decord2", "3.0.0"),
    ("molmo_utils", "0.0.1"),
    ("diffusers", "0.38.0"),
    ("timm", "1.0.30"),
    ("ftfy", "6.1.1"),
    ("iopath", "0.1.10"),
    ("pycocotools", "2.0.11"),
    ("lerobot", "0.4.4"),
    ("torchcodec", "0.5"),
    ("h5py", "3.14.0"),
    ("safetensors", "0.6.2"),
    ("numpy", "2.2.6"),
    ("numpy", "1.26.0"),
    ("packaging", "23.0"),
    ("typing_extensions", "4.12.2"),
    ("filelock", "3.13.1"),
    ("websockets", "12.0"),
    ("scipy", "1.15.3"),
    ("warp-lang", "1.11.0"),
    ("click", "8.1.7"),
    ("psutil", "5.9.8"),
    ("virtualenv", "20.30.0"),
    ("opencv-python-headless", "4.11.0.86"),
    ("transforms3d", "0.4.2"),
    ("open3d", "0.19.0"),
    ("msgpack-numpy", "0.4.8"),
    ("editables", "0.5"),
]
CUDA_INDEX = [
    ("torch", "2.7.1+cu128"),
    ("torchvision", "0.22.1+cu128"),
    ("torch", "2.7.0+cu128"),
    ("torchvision", "0.22.0+cu128"),
    ("torchaudio", "2.7.0+cu128"),
]
#: The other accelerator variants' indexes (smolvla: cpu, cu126, cu128; robodojo: cu126, cu128).
VARIANT_INDEXES = {
    "cpu": [("torch", "2.7.1+cpu"), ("torchvision", "0.22.1+cpu")],
    "cu126": [
        ("torch", "2.7.1+cu126"),
        ("torchvision", "0.22.1+cu126"),
        ("torch", "2.7.0+cu126"),
        ("torchvision", "0.22.0+cu126"),
        ("torchaudio", "2.7.0+cu126"),
    ],
}
ISAACLAB = ["isaaclab", "isaaclab_assets", "isaaclab_contrib", "isaaclab_mimic", "isaaclab_rl", "isaaclab_tasks"]


@dataclass
class Seed:
    project: Path
    home: Path
    commits: dict[str, str]  # canonical URL -> the local counterpart's commit
    cuda: LocalIndex


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def new_repo(root: Path, slug: str) -> Path:
    repo = root / slug
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    return repo


def add_submodule(repo: Path, root: Path, slug: str, path: str) -> None:
    """A submodule at ``path`` whose .gitmodules URL is the canonical https://github.com one."""
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", (root / slug).as_uri(), path)
    git(repo, "config", "-f", ".gitmodules", f"submodule.{path}.url", f"https://github.com/{slug}")


def make_repos(root: Path) -> dict[str, str]:
    """The git counterparts under ``root/<org>/<name>``; canonical URL → commit."""
    commits: dict[str, str] = {}

    def done(slug: str, repo: Path) -> None:
        commits[f"https://github.com/{slug}"] = commit(repo, slug)

    xpl = new_repo(root, "XPolicyLab/XPolicyLab")
    write_source_tree(xpl, "xpolicylab", "0.1")
    (xpl / "backend.py").write_text((xpl / "backend.py").read_text() + DYNAMIC_EDITABLE)
    (xpl / "setup_policy_server.py").write_text("print('policy server')\n")
    (xpl / "policy" / "SmolVLA").mkdir(parents=True)
    (xpl / "policy" / "SmolVLA" / "deploy.yml").write_text("policy_name: SmolVLA\n")
    done("XPolicyLab/XPolicyLab", xpl)

    lab = new_repo(root, "yuechen0614/IsaacLab")
    for package in ISAACLAB:
        write_source_tree(lab / "source" / package, package, "0.1")
    done("yuechen0614/IsaacLab", lab)

    curobo = new_repo(root, "yuechen0614/curobo")
    write_source_tree(curobo, "nvidia_curobo", "0.7")
    done("yuechen0614/curobo", curobo)

    wan = new_repo(root, "OpenWAM-Official/Wan")
    (wan / "wan.py").write_text("BACKBONE = 'Wan2.2-TI2V-5B'\n")
    done("OpenWAM-Official/Wan", wan)

    openwam = new_repo(root, "OpenWAM-Official/OpenWAM")
    write_source_tree(openwam, "openwam", "0.1", requires=["torch", "transformers"])
    (openwam / "configs").mkdir()
    (openwam / "configs" / "deploy.yaml").write_text("dit_cache: true\n")
    add_submodule(openwam, root, "OpenWAM-Official/Wan", "third_party/Wan")
    done("OpenWAM-Official/OpenWAM", openwam)

    robodojo = new_repo(root, "RoboDojo-Benchmark/RoboDojo")
    # Not a package, as RoboDojo is not: a pyproject without a build system, run from the checkout.
    (robodojo / "pyproject.toml").write_text('[project]\nname = "robodojo"\nversion = "0.1.0"\n')
    (robodojo / "src" / "eval_client").mkdir(parents=True)
    (robodojo / "src" / "eval_client" / "main.py").write_text("print('eval client')\n")
    add_submodule(robodojo, root, "XPolicyLab/XPolicyLab", "XPolicyLab")
    add_submodule(robodojo, root, "yuechen0614/IsaacLab", "third_party/IsaacLab")
    add_submodule(robodojo, root, "yuechen0614/curobo", "third_party/curobo")
    done("RoboDojo-Benchmark/RoboDojo", robodojo)

    sam3 = new_repo(root, "facebookresearch/sam3")
    write_source_tree(sam3, "sam3", "0.1", requires=["timm"])
    done("facebookresearch/sam3", sam3)
    return commits


def copy_manifests(project: Path, commits: dict[str, str]) -> None:
    """The shipped manifests, each git rev retargeted to the counterpart's commit (only that)."""
    for folder in ("services", "benchmarks"):
        shutil.copytree(REPO / folder, project / folder)
        for path in sorted((project / folder).glob("*.toml")):
            text = path.read_text()

            def retarget(match: re.Match[str]) -> str:
                return f'{match.group(1)}{commits[match.group(2)]}"'

            new = re.sub(r'(repo = "(https://github\.com/[^"]+)", rev = ")[^"]*"', retarget, text)
            # Nothing but the revs differs from the shipped file.
            assert re.sub(r'rev = "[^"]*"', 'rev = ""', new) == re.sub(r'rev = "[^"]*"', 'rev = ""', text)
            path.write_text(new)


def settings(home: Path, *, pypi: str, cuda: str, nvidia: str, hub: str, github: str, variants: dict[str, str]) -> str:
    return f'''[indexes]
pypi = "{pypi}"
pytorch-cu128 = "{cuda}"
pytorch-cpu = "{variants["cpu"]}"
pytorch-cu126 = "{variants["cu126"]}"
nvidia = "{nvidia}"

[hubs]
huggingface = "{hub}"
modelscope = "{hub}"

[git-mirrors]
"https://github.com/" = "{github}/"

[lock]
platform = "x86_64-manylinux_2_28"

[lock.python]
"3.10" = "3.10.13"
"3.11" = "3.11.7"
"3.12" = "3.12.1"
'''


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seed]:
    base = tmp_path_factory.mktemp("seed")
    default, cuda, nvidia = (
        LocalIndex(base / "pypi"),
        LocalIndex(base / "cu128", json_api=False),
        LocalIndex(base / "nvidia"),
    )
    for name, version in DEFAULT_INDEX:
        default.add_wheel(name, version)
    for name, version in CUDA_INDEX:
        cuda.add_wheel(name, version, tag="cp310.cp311.cp312-none-manylinux_2_28_x86_64")
    nvidia.add_wheel("isaacsim", "5.1.0")
    others = {label: LocalIndex(base / label, json_api=False) for label in VARIANT_INDEXES}
    for label, wheels in VARIANT_INDEXES.items():
        for name, version in wheels:
            others[label].add_wheel(name, version, tag="cp310.cp311.cp312-none-manylinux_2_28_x86_64")
    with pytest.MonkeyPatch.context() as mp:
        # Realized and run as the lab's CUDA 12.8 server would (robodojo has no cpu variant).
        mp.setenv("HARNESS_CUDA_DRIVER", "12.8")
        mp.delenv("HARNESS_VARIANT", raising=False)
        mp.setenv("GIT_CONFIG_GLOBAL", os.devnull)
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        for name in list(os.environ):  # nothing but the settings file may say where things are
            if name.startswith(("HARNESS_INDEX_", "UV_")) or name in (
                "HF_ENDPOINT",
                "HARNESS_MODELSCOPE_ENDPOINT",
                "MODELSCOPE_ENDPOINT",
                "HF_TOKEN",
                "HUGGING_FACE_HUB_TOKEN",
                "HF_HUB_OFFLINE",
                "HARNESS_DEPLOY",
            ):
                mp.delenv(name)
        for key, value in {
            "HF_HOME": base / "hf-home",
            "MODELSCOPE_CACHE": base / "ms-cache",
            "MODELSCOPE_HOME": base / "ms-home",
        }.items():
            mp.setenv(key, str(value))
        commits = make_repos(base / "github")
        project = base / "project"
        project.mkdir()
        shutil.copy(REPO / "harness.toml", project / "harness.toml")
        copy_manifests(project, commits)
        (project / "weights" / "simate").mkdir(parents=True)
        (project / "weights" / "simate" / "model.safetensors").write_bytes(b"simate stand-in")
        with default, cuda, nvidia, others["cpu"], others["cu126"], HubServer() as hub:
            hub.ms_commit("facebook/sam3", {"sam3.pt": b"sam3 stand-in", "configuration.json": b"{}"})
            hub.hf_commit("allenai/Molmo2-8B", {"config.json": b"{}", "model.safetensors": b"molmo2"})
            hub.hf_commit("OpenWAM/OpenWAM-Alpha-Sim-RoboDojo", {"config.json": b"{}", "dit.safetensors": b"wam"})
            hub.hf_commit("lerobot/smolvla_base", {"config.json": b"{}", "model.safetensors": b"smolvla"})
            hub.hf_commit("HuggingFaceTB/SmolVLM2-500M-Video-Instruct", {"config.json": b"{}"})
            hub.hf_dataset_commit(
                "RoboDojo-Benchmark/RoboDojo",
                {
                    "Assets/Robots/arx_x5.usd": b"robot",
                    "Assets/Eval_Layout/task0.json": b"{}",
                    "ckpt/RoboDojo/SmolVLA/model.safetensors": b"not in Assets/",
                },
            )
            home = base / "home"
            home.mkdir()
            (home / "config.toml").write_text(
                settings(
                    home,
                    pypi=default.url,
                    cuda=cuda.url,
                    nvidia=nvidia.url,
                    hub=hub.url,
                    github=(base / "github").as_uri(),
                    variants={label: index.url for label, index in others.items()},
                )
            )
            yield Seed(project, home, commits, cuda)


def harness(seed: Seed, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    result = run_harness_process("--project", str(seed.project), "--home", str(seed.home), *args, timeout=timeout)
    assert "Traceback" not in result.stderr
    return result


@pytest.fixture(scope="module")
def locked(seed: Seed) -> Seed:
    result = harness(seed, "lock", "--json")
    assert result.returncode == 0, result.stderr
    assert all(entry["error"] is None for entry in json.loads(result.stdout)["locks"])
    return seed


def test_every_shipped_manifest_locks(locked: Seed) -> None:
    names = {p.name.removesuffix(".lock.toml") for p in (locked.project / "locks").glob("*.lock.toml")}
    assert names == {
        "sam3",
        "molmo2",
        "openwam",
        "smolvla",
        "simate",
        "kinematics",
        "robodojo",
        "reach",
        "reach-remote",
    }
    assert harness(locked, "lock", "--check").returncode == 0

    openwam = tomllib.loads((locked.project / "locks" / "openwam.lock.toml").read_text())
    packages = {p["name"]: p for p in openwam["packages"]}
    assert (packages["torch"]["version"], packages["torch"]["index"]) == ("2.7.1+cu128", "pytorch-cu128")
    assert (packages["torchvision"]["version"], packages["torchvision"]["index"]) == ("0.22.1+cu128", "pytorch-cu128")
    assert packages["transformers"]["index"] == "pypi"
    [source] = openwam["sources"]
    assert source["repo"] == "https://github.com/OpenWAM-Official/OpenWAM"  # canonical, not the mirror
    assert [(m["path"], m["url"]) for m in source["submodules"]] == [
        ("third_party/Wan", "https://github.com/OpenWAM-Official/Wan")
    ]

    robodojo = tomllib.loads((locked.project / "locks" / "robodojo.lock.toml").read_text())
    packages = {(p["name"], tuple(p.get("variants", []))): p for p in robodojo["packages"]}
    assert packages[("isaacsim", ())]["index"] == "nvidia"
    assert packages[("torchaudio", ("cu128",))]["version"] == "2.7.0+cu128"
    assert packages[("torchaudio", ("cu126",))]["version"] == "2.7.0+cu126"
    assert [(t["variant"], t["cuda"]) for t in robodojo["targets"]] == [("cu126", "12.6"), ("cu128", "12.8")]
    dojo = next(s for s in robodojo["sources"] if s["name"] == "RoboDojo")
    assert [m["path"] for m in dojo["submodules"]] == ["XPolicyLab", "third_party/IsaacLab", "third_party/curobo"]
    assert dojo["links"] == {"Assets": "robodojo/Assets"}
    [assets] = robodojo["weights"]
    assert assets["repo_type"] == "dataset" and {f["path"] for f in assets["files"]} == {
        "Assets/Robots/arx_x5.usd",
        "Assets/Eval_Layout/task0.json",
    }

    smolvla = tomllib.loads((locked.project / "locks" / "smolvla.lock.toml").read_text())
    assert {p["name"] for p in smolvla["build-packages"]} == {"editables"}  # XPolicyLab asked for it
    # One lock, every variant: torch from each variant's index, what they share once.
    assert [t["variant"] for t in smolvla["targets"]] == ["cpu", "cu126", "cu128"]
    torch = {tuple(p["variants"]): (p["version"], p["index"]) for p in smolvla["packages"] if p["name"] == "torch"}
    assert torch == {
        ("cpu",): ("2.7.1+cpu", "pytorch-cpu"),
        ("cu126",): ("2.7.1+cu126", "pytorch-cu126"),
        ("cu128",): ("2.7.1+cu128", "pytorch-cu128"),
    }
    assert [p.get("variants") for p in smolvla["packages"] if p["name"] == "h5py"] == [None]
    text = "".join(p.read_text() for p in (locked.project / "locks").glob("*.lock.toml"))
    assert "127.0.0.1" not in text and "file://" not in text


def test_every_shipped_manifest_realizes_and_runs_from_the_store(locked: Seed) -> None:
    result = harness(locked, "realize", "--json")
    assert result.returncode == 0, result.stderr
    store = Store.in_home(locked.home)
    for name, imports in {
        "openwam": "import torch, openwam; assert torch.__version__ == '2.7.1+cu128'",
        "smolvla": "import lerobot, xpolicylab, h5py, torch; assert torch.__version__ == '2.7.1+cu128'",
        "robodojo": "import src.eval_client.main, xpolicylab, isaaclab_tasks, nvidia_curobo, isaacsim, torchaudio",
        "sam3": "import sam3, timm",
        "molmo2": "import molmo_utils, decord2",
    }.items():
        # As realized here: a host interpreter standing in gives the environment its own path.
        lock = realized_lock(store, read(locked.project / "locks" / f"{name}.lock.toml"))
        python = store.root / lock.environment.store / "bin" / "python"
        run = subprocess.run([str(python), "-c", imports], capture_output=True, text=True)
        assert run.returncode == 0, f"{name}: {run.stderr}"
    robodojo = read(locked.project / "locks" / "robodojo.lock.toml")
    dojo = store.root / next(s.store for s in robodojo.sources if s.name == "RoboDojo")
    assert (dojo / "third_party" / "IsaacLab" / "source" / "isaaclab" / "pyproject.toml").is_file()
    assert (dojo / "XPolicyLab" / "policy" / "SmolVLA" / "deploy.yml").is_file()
    # RoboDojo finds Assets beside its code: {source:RoboDojo} and sys.path name its view.
    from harness.lock.storepaths import source_folders

    view = store.root / source_folders(realized_lock(store, robodojo))[0]
    assert view != dojo and (view / "Assets" / "Robots" / "arx_x5.usd").is_file()
    assert (view / "src" / "eval_client" / "main.py").is_file()

    # Realized: the same locks realize again with no network at all, from the store.
    assert harness(locked, "realize", "--offline").returncode == 0
