"""Locking and fetching weight sets against a local hub server, through the real hub clients."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from harness.config import Settings
from harness.errors import HarnessError
from harness.manifests.model import Weights
from harness.resolve.pins import WeightFile, WeightSet
from harness.resolve.weights import fetch_weight_file, include_matches, lock_weights
from tests.conftest_hub import hub_settings  # hub_server comes from tests/conftest.py's plugins
from tests.hubserver import HubServer


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


WEIGHTS = os.urandom(300_000)  # an "LFS" file, large enough for a ranged resume to matter
SHARD = os.urandom(40_000)
CONFIG = b'{"hidden_size": 8}\n'
VOCAB = b"a\nb\nc\n"
HF_FILES = {
    "model.safetensors": WEIGHTS,
    "sub/shard-1.bin": SHARD,
    "config.json": CONFIG,
    "tokenizer/vocab.txt": VOCAB,
}


def lock(weights: Weights, server: HubServer, tmp_path: Path, **kwargs) -> WeightSet:
    return lock_weights(
        weights, project_root=tmp_path, settings=hub_settings(server), cache_dir=tmp_path / "cache", **kwargs
    )


def fetch(ws: WeightSet, f: WeightFile, dest: Path, server: HubServer, tmp_path: Path, **kwargs) -> None:
    fetch_weight_file(ws, f, dest, project_root=tmp_path, settings=hub_settings(server), **kwargs)


# ---------------------------------------------------------------------------------------------
# include patterns


def test_include_semantics() -> None:
    assert include_matches("anything", [])
    assert include_matches("model.safetensors", ["*.safetensors"])
    assert include_matches("sub/model.safetensors", ["*.safetensors"])  # '*' crosses '/'
    assert include_matches("tokenizer/vocab.txt", ["tokenizer/"])
    assert not include_matches("tokenizer.json", ["tokenizer/"])
    assert not include_matches("Model.SAFETENSORS", ["*.safetensors"])  # case-sensitive


# ---------------------------------------------------------------------------------------------
# Hugging Face


def test_hf_lock_branch_resolves_commit_and_hashes(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", {"config.json": b"old"})
    commit = hub_server.hf_commit("org/model", HF_FILES)
    hub_server.clear_requests()

    ws = lock(Weights(dir="m", huggingface_model="org/model"), hub_server, tmp_path)

    assert ws.provider == "huggingface_model" and ws.repo == "org/model" and ws.dir == "m"
    assert ws.revision == commit  # the branch "main" resolved to its commit
    assert [f.path for f in ws.files] == sorted(HF_FILES)
    for f in ws.files:
        assert (f.size, f.sha256, f.revision) == (len(HF_FILES[f.path]), sha(HF_FILES[f.path]), None)
    # LFS files are pinned from the listing; only the small non-LFS files were downloaded.
    downloaded = {r.path.split("/resolve/")[1].split("/", 1)[1] for r in hub_server.requests_for("/resolve/", "GET")}
    assert downloaded == {"config.json", "tokenizer/vocab.txt"}
    assert all(f"/resolve/{commit}/" in r.path for r in hub_server.requests_for("/resolve/"))
    assert not list((tmp_path / "cache").iterdir())  # scratch downloads are cleaned up


def test_hf_lock_by_commit_and_tag(hub_server: HubServer, tmp_path: Path) -> None:
    first = hub_server.hf_commit("org/model", {"a.bin": b"one"})
    hub_server.hf_tag("org/model", "v1")
    hub_server.hf_commit("org/model", {"a.bin": b"two"})
    by_commit = lock(Weights(dir="m", huggingface_model="org/model", revision=first), hub_server, tmp_path)
    by_tag = lock(Weights(dir="m", huggingface_model="org/model", revision="v1"), hub_server, tmp_path)
    assert by_commit == by_tag
    assert by_tag.revision == first and by_tag.files == (WeightFile("a.bin", 3, sha(b"one")),)


def test_hf_include_patterns(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", HF_FILES)
    hub_server.clear_requests()
    ws = lock(
        Weights(dir="m", huggingface_model="org/model", include=["*.safetensors", "tokenizer/"]),
        hub_server,
        tmp_path,
    )
    assert [f.path for f in ws.files] == ["model.safetensors", "tokenizer/vocab.txt"]
    # An excluded non-LFS file is never downloaded just to hash it.
    assert not hub_server.requests_for("config.json")

    with pytest.raises(HarnessError, match=r"no file of Hugging Face org/model@[0-9a-f]{40} matches include"):
        lock(Weights(dir="m", huggingface_model="org/model", include=["*.gguf"]), hub_server, tmp_path)


def test_hf_unknown_repo_revision_and_gated(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", HF_FILES)
    with pytest.raises(HarnessError, match=r"org/missing \(revision main\): repository not found"):
        lock(Weights(dir="m", huggingface_model="org/missing"), hub_server, tmp_path)
    with pytest.raises(HarnessError, match=r"org/model \(revision nope\): no such revision"):
        lock(Weights(dir="m", huggingface_model="org/model", revision="nope"), hub_server, tmp_path)

    # A gated repo lists its files, but refuses downloads: the non-LFS file cannot be hashed.
    hub_server.hf_commit("org/gated", {"config.json": CONFIG}, gated=True)
    with pytest.raises(HarnessError, match=r"org/gated .*config.json: the repo is gated") as info:
        lock(Weights(dir="m", huggingface_model="org/gated"), hub_server, tmp_path)
    assert "HF_TOKEN" in str(info.value)


def test_hf_unreachable_and_offline(hub_server: HubServer, tmp_path: Path) -> None:
    dead = Settings(hubs={"huggingface": "http://127.0.0.1:9"})
    spec = Weights(dir="m", huggingface_model="org/model")
    with pytest.raises(HarnessError, match="cannot reach http://127.0.0.1:9"):
        lock_weights(spec, project_root=tmp_path, settings=dead, cache_dir=tmp_path / "c")
    with pytest.raises(HarnessError, match="needs the network"):
        lock_weights(spec, project_root=tmp_path, settings=dead, cache_dir=tmp_path / "c", offline=True)

    hub_server.hf_commit("org/model", HF_FILES)
    online = lock(spec, hub_server, tmp_path)
    offline = lock_weights(
        Weights(dir="m", huggingface_model="org/model", include=["*.bin"]),
        project_root=tmp_path,
        settings=dead,
        cache_dir=tmp_path / "c",
        offline=True,
        previous=online,
    )
    assert offline.revision == online.revision
    assert [f.path for f in offline.files] == ["sub/shard-1.bin"]


def test_hf_dataset_lock_with_include_and_fetch(hub_server: HubServer, tmp_path: Path) -> None:
    files = {"Assets/scene.npz": SHARD, "Assets/meta.json": CONFIG, "README.md": b"# data\n"}
    commit = hub_server.hf_dataset_commit("org/data", files)
    hub_server.hf_commit("org/data", {"other.bin": b"a model of the same name"})  # not read
    hub_server.clear_requests()

    spec = Weights(dir="d", huggingface_model="org/data", repo_type="dataset", include=["Assets/"])
    ws = lock(spec, hub_server, tmp_path)

    assert (ws.provider, ws.repo, ws.repo_type, ws.revision) == ("huggingface_model", "org/data", "dataset", commit)
    assert ws.files == (
        WeightFile("Assets/meta.json", len(CONFIG), sha(CONFIG)),
        WeightFile("Assets/scene.npz", len(SHARD), sha(SHARD)),
    )
    assert hub_server.requests_for("/api/datasets/org/data") and not hub_server.requests_for("/api/models/")
    # The non-LFS file was hashed through the dataset download URL at the commit.
    assert [r.path for r in hub_server.requests_for("/resolve/", "GET")] == [
        f"/datasets/org/data/resolve/{commit}/Assets/meta.json"
    ]

    hub_server.clear_requests()
    scene = next(f for f in ws.files if f.path == "Assets/scene.npz")
    fetch(ws, scene, tmp_path / "scene.npz", hub_server, tmp_path)
    assert (tmp_path / "scene.npz").read_bytes() == SHARD
    assert {r.path for r in hub_server.requests_for("/resolve/")} == {
        f"/datasets/org/data/resolve/{commit}/Assets/scene.npz"
    }

    # A model lock of the same name is a different source: a dataset pin never stands in for it.
    model = lock(Weights(dir="d", huggingface_model="org/data"), hub_server, tmp_path, previous=ws)
    assert model.repo_type == "model" and [f.path for f in model.files] == ["other.bin"]
    with pytest.raises(HarnessError, match=r"Hugging Face dataset org/missing \(revision main\): repository not found"):
        lock(Weights(dir="d", huggingface_model="org/missing", repo_type="dataset"), hub_server, tmp_path)


@pytest.mark.parametrize(
    "provider", [{"modelscope_model": "ms/model"}, {"url": "https://example.org/w.bin"}, {"path": "w"}]
)
def test_repo_type_only_for_huggingface(provider: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="repo_type applies to huggingface_model weights only"):
        Weights(dir="w", repo_type="dataset", **provider)
    with pytest.raises(ValueError, match="repo_type"):
        Weights(dir="w", huggingface_model="org/data", repo_type="space")
    plain = Weights(dir="w", huggingface_model="org/m")
    assert plain.hf_repo_type == "model"
    assert "repo_type" not in plain.model_dump(), "an unset key keeps existing manifest digests"
    assert Weights(dir="w", huggingface_model="org/m", repo_type="dataset").model_dump()["repo_type"] == "dataset"


# ---------------------------------------------------------------------------------------------
# ModelScope

MS_V1 = {"model.bin": WEIGHTS, "configuration.json": CONFIG, "tok/vocab.txt": VOCAB}


def test_modelscope_lock_tag_records_file_revisions(hub_server: HubServer, tmp_path: Path) -> None:
    first = hub_server.ms_commit("ms/model", {"model.bin": WEIGHTS, "configuration.json": b"{}"})
    second = hub_server.ms_commit("ms/model", MS_V1, tag="v1.0")  # changes config, adds vocab

    ws = lock(Weights(dir="w", modelscope_model="ms/model", revision="v1.0"), hub_server, tmp_path)

    assert (ws.provider, ws.repo, ws.revision) == ("modelscope_model", "ms/model", "v1.0")
    assert ws.files == (
        WeightFile("configuration.json", len(CONFIG), sha(CONFIG), revision=second),
        WeightFile("model.bin", len(WEIGHTS), sha(WEIGHTS), revision=first),  # unchanged since
        WeightFile("tok/vocab.txt", len(VOCAB), sha(VOCAB), revision=second),
    )
    default = lock(Weights(dir="w", modelscope_model="ms/model"), hub_server, tmp_path)
    assert default.revision == "master" and default.files == ws.files

    only = lock(Weights(dir="w", modelscope_model="ms/model", include=["tok/"]), hub_server, tmp_path)
    assert [f.path for f in only.files] == ["tok/vocab.txt"]


def test_modelscope_moved_tag_is_refused(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.ms_commit("ms/model", MS_V1, tag="v1.0")
    spec = Weights(dir="w", modelscope_model="ms/model", revision="v1.0")
    before = lock(spec, hub_server, tmp_path)
    assert lock(spec, hub_server, tmp_path, previous=before) == before  # unchanged: fine

    changed = b'{"changed": 1}'
    hub_server.ms_commit("ms/model", {**MS_V1, "configuration.json": changed})
    hub_server.ms_tag("ms/model", "v1.0")  # someone moves the tag
    with pytest.raises(HarnessError) as info:
        lock(spec, hub_server, tmp_path, previous=before)
    assert str(info.value).startswith(
        f"ModelScope tag v1.0 of repo ms/model changed: file configuration.json was sha {sha(CONFIG)} "
        f"now {sha(changed)}"
    )
    # Without a previous lock (or for a different tag) the new content is simply pinned.
    assert lock(spec, hub_server, tmp_path).files != before.files


def test_modelscope_moved_branch_is_followed(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.ms_commit("ms/model", MS_V1)
    spec = Weights(dir="w", modelscope_model="ms/model")
    before = lock(spec, hub_server, tmp_path)
    hub_server.ms_commit("ms/model", {**MS_V1, "configuration.json": b"{}"})
    after = lock(spec, hub_server, tmp_path, previous=before)  # branches move by design
    assert after.files != before.files and after.revision == "master"


def test_modelscope_unknown_repo_and_revision(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.ms_commit("ms/model", MS_V1, tag="v1.0")
    with pytest.raises(HarnessError, match=r"ms/missing \(revision master\): not found"):
        lock(Weights(dir="w", modelscope_model="ms/missing"), hub_server, tmp_path)
    with pytest.raises(HarnessError, match=r"ms/model has no revision 'v2.0'") as info:
        lock(Weights(dir="w", modelscope_model="ms/model", revision="v2.0"), hub_server, tmp_path)
    assert "tags: v1.0" in str(info.value)


# ---------------------------------------------------------------------------------------------
# url and path


def test_url_with_correct_wrong_and_absent_sha256(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.static("ckpt/policy v1.pt", SHARD)
    url = f"{hub_server.url}/static/ckpt/policy%20v1.pt"  # the file name is the unquoted last part

    absent = lock(Weights(dir="p", url=url), hub_server, tmp_path)
    assert absent.revision is None and absent.repo == url
    assert absent.files == (WeightFile("policy v1.pt", len(SHARD), sha(SHARD)),)

    pinned = Weights(dir="p", url=url, sha256=sha(SHARD))
    assert lock(pinned, hub_server, tmp_path) == absent
    # The manifest pins the content and the previous lock its size: no second download.
    hub_server.clear_requests()
    assert lock(pinned, hub_server, tmp_path, previous=absent) == absent
    assert not hub_server.requests

    wrong = "0" * 64
    with pytest.raises(HarnessError) as info:
        lock(Weights(dir="p", url=url, sha256=wrong), hub_server, tmp_path)
    assert f"has sha256 {sha(SHARD)}, the manifest expects {wrong}" in str(info.value)

    with pytest.raises(HarnessError, match="HTTP 404"):
        lock(Weights(dir="p", url=f"{hub_server.url}/static/missing.pt"), hub_server, tmp_path)


def test_url_file_scheme(tmp_path: Path) -> None:
    source = tmp_path / "w.bin"
    source.write_bytes(CONFIG)
    ws = lock_weights(
        Weights(dir="w", url=source.as_uri()),
        project_root=tmp_path,
        settings=Settings(),
        cache_dir=tmp_path / "c",
        offline=True,  # a file:// URL needs no network
    )
    assert ws.files == (WeightFile("w.bin", len(CONFIG), sha(CONFIG)),)
    dest = tmp_path / "out" / "w.bin"
    fetch_weight_file(ws, ws.files[0], dest, project_root=tmp_path, settings=Settings())
    assert dest.read_bytes() == CONFIG


def test_path_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "assets"
    (folder / "meshes").mkdir(parents=True)
    (folder / "meshes" / "arm.obj").write_bytes(b"v 0 0 0\n")
    (folder / "scene.xml").write_bytes(b"<mujoco/>")
    (folder / "alias.xml").symlink_to("scene.xml")  # inside the folder: followed
    (folder / "parts").symlink_to("meshes", target_is_directory=True)
    settings = Settings()

    ws = lock_weights(
        Weights(dir="a", path="assets"), project_root=tmp_path, settings=settings, cache_dir=tmp_path / "c"
    )
    assert ws.repo == "assets" and ws.revision is None
    assert [(f.path, f.size, f.sha256) for f in ws.files] == [
        ("alias.xml", 9, sha(b"<mujoco/>")),
        ("meshes/arm.obj", 8, sha(b"v 0 0 0\n")),
        ("parts/arm.obj", 8, sha(b"v 0 0 0\n")),
        ("scene.xml", 9, sha(b"<mujoco/>")),
    ]
    single = lock_weights(
        Weights(dir="a", path=str(folder / "scene.xml")),
        project_root=Path("/nonexistent"),
        settings=settings,
        cache_dir=tmp_path / "c",
    )
    assert single.files == (WeightFile("scene.xml", 9, sha(b"<mujoco/>")),)

    for f in ws.files:
        fetch_weight_file(ws, f, tmp_path / "out" / f.path, project_root=tmp_path, settings=settings)
    assert (tmp_path / "out" / "parts" / "arm.obj").read_bytes() == b"v 0 0 0\n"

    (tmp_path / "secret").write_bytes(b"x")
    (folder / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(HarnessError, match=r"leak is a symbolic link to .*secret, outside"):
        lock_weights(
            Weights(dir="a", path="assets"), project_root=tmp_path, settings=settings, cache_dir=tmp_path / "c"
        )
    with pytest.raises(HarnessError, match="does not exist"):
        lock_weights(
            Weights(dir="a", path="nothing"), project_root=tmp_path, settings=settings, cache_dir=tmp_path / "c"
        )


# ---------------------------------------------------------------------------------------------
# fetch_weight_file


def test_fetch_resumes_from_part_with_range(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", HF_FILES)
    ws = lock(Weights(dir="m", huggingface_model="org/model"), hub_server, tmp_path)
    big = next(f for f in ws.files if f.path == "model.safetensors")
    dest = tmp_path / "store" / "model.safetensors"
    dest.parent.mkdir()
    held = 123_456
    Path(f"{dest}.part").write_bytes(WEIGHTS[:held])  # an interrupted earlier run
    hub_server.clear_requests()
    seen: list[int] = []

    fetch(ws, big, dest, hub_server, tmp_path, progress=seen.append)

    assert dest.read_bytes() == WEIGHTS and not Path(f"{dest}.part").exists()
    (request,) = hub_server.requests_for("/resolve/")
    assert request.method == "GET" and request.headers.get("range") == f"bytes={held}-"
    assert request.path == f"/org/model/resolve/{ws.revision}/model.safetensors"
    assert seen[0] == held and sum(seen) == len(WEIGHTS)

    hub_server.clear_requests()
    fetch(ws, big, dest, hub_server, tmp_path)  # already complete: no transfer
    assert not hub_server.requests


def test_fetch_rejects_corrupted_download(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", HF_FILES)
    ws = lock(Weights(dir="m", huggingface_model="org/model"), hub_server, tmp_path)
    big = next(f for f in ws.files if f.path == "model.safetensors")
    dest = tmp_path / "store" / "model.safetensors"

    # The server sending wrong bytes (a corrupting proxy) is refused, naming expected/actual.
    bad = WEIGHTS[:-1] + bytes([WEIGHTS[-1] ^ 1])  # always differs (a fixed byte equals a random one 1 time in 256)
    hub_server.tamper("hf", "org/model", "model.safetensors", bad)
    with pytest.raises(HarnessError) as info:
        fetch(ws, big, dest, hub_server, tmp_path)
    message = str(info.value)
    assert "'m': model.safetensors from Hugging Face org/model@" in message
    assert f"expected sha256 {sha(WEIGHTS)} ({len(WEIGHTS)} bytes), got sha256 {sha(bad)}" in message
    assert not dest.exists() and not Path(f"{dest}.part").exists()

    # A wrong size is refused too, and the transfer stops once it exceeds the locked size.
    hub_server.tamper("hf", "org/model", "model.safetensors", WEIGHTS + b"x" * 5_000_000)
    with pytest.raises(HarnessError, match=r"got sha256 [0-9a-f]{64} \(\d+ bytes\)"):
        fetch(ws, big, dest, hub_server, tmp_path)
    assert not dest.exists()


def test_fetch_heals_stale_part_and_cut_transfers(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.hf_commit("org/model", HF_FILES)
    ws = lock(Weights(dir="m", huggingface_model="org/model"), hub_server, tmp_path)
    big = next(f for f in ws.files if f.path == "model.safetensors")
    dest = tmp_path / "store" / "model.safetensors"
    dest.parent.mkdir()

    # A .part whose bytes are not this file's: the resumed result fails, one clean retry fixes it.
    Path(f"{dest}.part").write_bytes(b"\0" * 1000)
    hub_server.clear_requests()
    seen: list[int] = []
    fetch(ws, big, dest, hub_server, tmp_path, progress=seen.append)
    assert dest.read_bytes() == WEIGHTS and sum(seen) == len(WEIGHTS)
    assert [r.headers.get("range") for r in hub_server.requests_for("/resolve/")] == ["bytes=1000-", None]

    # A connection dropped mid-body is resumed within the same call.
    dest.unlink()
    hub_server.clear_requests()
    hub_server.cut_next("model.safetensors", after=100_000)
    fetch(ws, big, dest, hub_server, tmp_path)
    assert dest.read_bytes() == WEIGHTS
    assert [r.headers.get("range") for r in hub_server.requests_for("/resolve/")] == [None, "bytes=100000-"]

    # A server that ignores Range restarts the file from zero.
    dest.unlink()
    Path(f"{dest}.part").write_bytes(WEIGHTS[:5000])
    hub_server.honor_ranges = False
    seen.clear()
    fetch(ws, big, dest, hub_server, tmp_path, progress=seen.append)
    assert dest.read_bytes() == WEIGHTS and sum(seen) == len(WEIGHTS) and seen[:2] == [5000, -5000]


def test_fetch_modelscope_and_url(hub_server: HubServer, tmp_path: Path) -> None:
    first = hub_server.ms_commit("ms/model", MS_V1, tag="v1.0")
    ws = lock(Weights(dir="w", modelscope_model="ms/model", revision="v1.0"), hub_server, tmp_path)
    # Moving the tag afterwards does not change what realize fetches: each file's own revision.
    hub_server.ms_commit("ms/model", {"model.bin": b"other"})
    hub_server.ms_tag("ms/model", "v1.0")
    hub_server.clear_requests()
    for f in ws.files:
        fetch(ws, f, tmp_path / "ms" / f.path, hub_server, tmp_path)
    assert {p: (tmp_path / "ms" / p).read_bytes() for p in MS_V1} == MS_V1
    assert {r.query["Revision"] for r in hub_server.requests_for("/repo", "GET")} == {first}

    url = hub_server.static("policy.pt", SHARD)
    uws = lock(Weights(dir="p", url=url), hub_server, tmp_path)
    fetch(uws, uws.files[0], tmp_path / "p" / "policy.pt", hub_server, tmp_path)
    assert (tmp_path / "p" / "policy.pt").read_bytes() == SHARD


def test_real_modelscope_client_downloads_from_server(hub_server: HubServer, tmp_path: Path) -> None:
    """The fake hub is faithful enough for the ModelScope client's own download path."""
    from modelscope_hub import HubApi

    hub_server.ms_commit("ms/model", MS_V1, tag="v1.0")
    path = HubApi(endpoint=hub_server.url).download_file(
        "ms/model",
        "model",
        "tok/vocab.txt",
        revision="v1.0",
        local_dir=tmp_path / "dl",
        expected_sha256=sha(VOCAB),
    )
    assert Path(path).read_bytes() == VOCAB
