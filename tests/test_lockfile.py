"""The lock document: deterministic bytes, round trip, store paths as a pure function."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import InputError
from harness.lock.document import (
    LOCK_VERSION,
    Lock,
    LockedFile,
    LockedInterpreter,
    LockedPackage,
    LockedSource,
    LockedSubmodule,
    LockedTarget,
    LockedWeightFile,
    LockedWeights,
)
from harness.lock.lockfile import dumps, read, write
from harness.lock.storepaths import assign_store_paths

SHA = "ab" * 32


def _lock(*, store_paths: bool = True, **changes: object) -> Lock:
    base = dict(
        lock_version=LOCK_VERSION,
        name="demo",
        type="service",
        manifest="services/demo.toml",
        manifest_digest="blake3:" + "0" * 64,
        uv="0.13.9",
        python=LockedInterpreter(
            implementation="cpython", version="3.11.7", platform="x86_64-manylinux_2_28", source="uv-managed"
        ),
        packages=[
            LockedPackage(
                name="zeta",
                version="1.0",
                index="pypi",
                wheels=[LockedFile(file="zeta-1.0-py3-none-any.whl", size=10, sha256=SHA)],
            ),
            LockedPackage(
                name="alpha",
                version="2.0",
                index="lab",
                marker='sys_platform == "linux"',
                wheels=[
                    LockedFile(file="alpha-2.0-cp311-cp311-manylinux_2_28_x86_64.whl", size=5, sha256="cd" * 32),
                    LockedFile(file="alpha-2.0-cp311-cp311-manylinux_2_17_x86_64.whl", size=6, sha256="ef" * 32),
                ],
            ),
        ],
        sources=[
            LockedSource(
                name="tool",
                repo="file:///srv/tool.git",
                rev="main",
                commit="1" * 40,
                tree="blake3:" + "2" * 64,
                install="editable",
                subdirectory="py",
            )
        ],
        weights=[
            LockedWeights(
                dir="arm",
                provider="path",
                repo="assets/arm",
                files=[
                    LockedWeightFile(path="b.json", size=3, sha256=SHA),
                    LockedWeightFile(path="a.json", size=2, sha256="cd" * 32),
                ],
            )
        ],
    )
    base.update(changes)
    lock = Lock(**base)  # type: ignore[arg-type]
    return assign_store_paths(lock) if store_paths else lock


def test_dumps_is_deterministic_and_sorted() -> None:
    text = dumps(_lock())
    assert text == dumps(_lock())
    assert text.index('name = "alpha"') < text.index('name = "zeta"')
    assert text.index("a.json") < text.index("b.json")
    assert text.index("manylinux_2_17") < text.index("manylinux_2_28_x86_64.whl")
    assert "http" not in text.replace("file:///srv/tool.git", "")


def test_round_trip(tmp_path: Path) -> None:
    lock = _lock()
    path = tmp_path / "demo.lock.toml"
    assert write(path, lock) is True
    assert read(path) == lock
    assert write(path, lock) is False, "unchanged bytes are not rewritten"


def test_store_paths_every_object_and_stable() -> None:
    lock = _lock()
    assert lock.python.store.endswith("-cpython-3.11.7")
    assert lock.environment.store.endswith("-demo-env")
    assert all(w.store.endswith(w.file) for p in lock.packages for w in p.wheels)
    assert lock.sources[0].store.endswith("-tool")
    assert lock.weights[0].store.endswith("-demo-arm")
    assert all(
        len(s.split("-", 1)[0]) == 32
        for s in [lock.python.store, lock.environment.store, lock.sources[0].store, lock.weights[0].store]
    )


def test_leaf_paths_are_fixed_output() -> None:
    lock = _lock()
    moved = _lock(
        sources=[lock.sources[0].model_copy(update={"repo": "https://mirror/tool.git", "rev": "v1", "store": ""})]
    )
    assert moved.sources[0].store == lock.sources[0].store, "where a source came from is not an input"
    bumped_pkg = lock.packages[1].model_copy(
        update={"wheels": [lock.packages[1].wheels[0].model_copy(update={"sha256": "ee" * 32, "store": ""})]}
    )
    bumped = _lock(packages=[lock.packages[0], bumped_pkg])
    assert bumped.environment.store != lock.environment.store
    assert bumped.python.store == lock.python.store
    assert bumped.weights[0].store == lock.weights[0].store


def test_index_change_keeps_paths() -> None:
    lock = _lock()
    renamed = [p.model_copy(update={"index": "mirror"}) for p in lock.packages]
    assert _lock(packages=renamed).environment.store == lock.environment.store


def test_corrupt_lock_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock.toml"
    path.write_text(dumps(_lock()).replace('commit = "' + "1" * 40, 'commit = "xyz'))
    with pytest.raises(InputError, match=r"demo.lock.toml: sources\[0\].commit"):
        read(path)


def test_weights_repo_type_written_only_for_datasets(tmp_path: Path) -> None:
    lock = _lock()
    assert "repo_type" not in dumps(lock), "model repos keep existing locks byte-identical"
    files = [LockedWeightFile(path="Assets/a.npz", size=2, sha256=SHA)]
    model = LockedWeights(dir="d", provider="huggingface_model", repo="org/d", revision="3" * 40, files=files)
    dataset = model.model_copy(update={"repo_type": "dataset"})
    as_model, as_dataset = _lock(weights=[model]), _lock(weights=[dataset])
    assert "repo_type" not in dumps(as_model)
    assert 'repo = "org/d"\nrepo_type = "dataset"\n' in dumps(as_dataset)
    assert as_dataset.weights[0].store == as_model.weights[0].store, "store paths are fixed by files only"
    path = tmp_path / "demo.lock.toml"
    write(path, as_dataset)
    assert read(path) == as_dataset


def test_host_copies_and_host_locks_never_take_the_uv_managed_name() -> None:
    from harness.lock.storepaths import host_interpreter_path, interpreter_path, is_host_interpreter, with_interpreter

    lock = _lock()
    assert with_interpreter(lock, lock.python.store) == lock
    copy = host_interpreter_path(lock.python, "blake3:" + "3" * 64)
    other = host_interpreter_path(lock.python, "blake3:" + "4" * 64)
    assert copy.endswith("-cpython-3.11.7-host") and is_host_interpreter(copy)
    assert len({copy, other, lock.python.store}) == 3, "a host copy is named by its content"
    assert not is_host_interpreter(lock.python.store)
    on_host = with_interpreter(lock, copy)
    assert on_host.python.store == copy and on_host.environment.store != lock.environment.store
    assert on_host.environment.store.endswith("-demo-env")
    assert [p.store for p in on_host.sources] == [p.store for p in lock.sources]
    # A lock whose interpreter can only come from a host (source = "host") names another path
    # than the uv-managed interpreter of the same version.
    host_lock = _lock(python=lock.python.model_copy(update={"source": "host", "store": ""}))
    assert host_lock.python.store != lock.python.store == interpreter_path(lock)
    assert host_lock.environment.store != lock.environment.store


def test_python_download_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.config import load_settings

    for name in (
        "HARNESS_PYTHON_DOWNLOADS_JSON_URL",
        "UV_PYTHON_DOWNLOADS_JSON_URL",
        "HARNESS_PYTHON_INSTALL_MIRROR",
        "UV_PYTHON_INSTALL_MIRROR",
    ):
        monkeypatch.delenv(name, raising=False)
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    assert load_settings(home, project).python_download_env() == {}
    (project / "harness.toml").write_text('[python]\ndownloads-json-url = "pythons/list.json"\n')
    (home / "config.toml").write_text('[python]\ninstall-mirror = "http://mirror.invalid/pbs"\n')
    settings = load_settings(home, project)
    assert settings.python_download_env() == {
        "UV_PYTHON_DOWNLOADS_JSON_URL": str(project / "pythons" / "list.json"),
        "UV_PYTHON_INSTALL_MIRROR": "http://mirror.invalid/pbs",
    }
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS_JSON_URL", "http://uv.invalid/list.json")
    assert load_settings(home, project).python_downloads_json_url == str(project / "pythons" / "list.json"), (
        "uv's own variable only fills in what harness's settings leave unset"
    )
    monkeypatch.setenv("HARNESS_PYTHON_DOWNLOADS_JSON_URL", "http://lab.invalid/list.json")
    assert load_settings(home, project).python_downloads_json_url == "http://lab.invalid/list.json"
    (home / "config.toml").write_text('[python]\nmirror = "x"\n')
    with pytest.raises(
        InputError,
        match=r"config.toml: python.mirror: unknown key; valid keys: "
        r"downloads-json-url, install-mirror",
    ):
        load_settings(home, project)
    (home / "config.toml").write_text('[python]\ninstall-mirror = "ftp://x"\n')
    with pytest.raises(InputError, match=r"python.install-mirror: expected an http\(s\):// or file:// address"):
        load_settings(home, project)
    (home / "config.toml").unlink()
    monkeypatch.setenv("HARNESS_PYTHON_INSTALL_MIRROR", "mirror/pbs")
    with pytest.raises(InputError, match=r"HARNESS_PYTHON_INSTALL_MIRROR: expected an http\(s\):// or file:// address"):
        load_settings(home, project)


def test_a_locked_weight_set_gives_back_the_resolver_pin_it_records() -> None:
    """Realize's fetch jobs and a re-lock's ``previous`` start from ``LockedWeights.pin()``:
    every field and every file (in the lock's order, each with its revision), no store path."""
    from harness.resolve.pins import WeightFile, WeightSet

    locked = LockedWeights(
        dir="ds",
        provider="huggingface_model",
        repo="org/data",
        revision="c" * 40,
        repo_type="dataset",
        store="",
        files=[
            LockedWeightFile(path="b.bin", size=3, sha256=SHA, revision="r2"),
            LockedWeightFile(path="a.bin", size=2, sha256="cd" * 32),
        ],
    )
    assert locked.pin() == WeightSet(
        dir="ds",
        provider="huggingface_model",
        repo="org/data",
        revision="c" * 40,
        repo_type="dataset",
        files=(WeightFile("b.bin", 3, SHA, "r2"), WeightFile("a.bin", 2, "cd" * 32, None)),
    )
    assert locked.files[0].pin() == WeightFile("b.bin", 3, SHA, "r2")


# ------------------------------------------------------------------ the lock's bytes, as before

# lockfile.dumps writes the lock line by line (harness.lock.tomltext). It must give the bytes
# that building a tomlkit document gave, or every lock would change on its next re-lock: this is
# that tomlkit writer, kept as the reference.


def _tomlkit_dumps(lock: Lock) -> str:
    import tomlkit

    def inline(values: dict[str, object]) -> object:
        table = tomlkit.inline_table()
        for key, value in values.items():
            table.append(key, value)
        return table

    def file_of(f: LockedFile) -> dict[str, object]:
        return {"file": f.file, "size": f.size, "sha256": f.sha256, "store": f.store}

    doc = tomlkit.document()
    doc.add(tomlkit.comment("This file is generated by `harness lock`; edit the manifest and re-lock instead."))
    for key, value in (
        ("lock-version", lock.lock_version),
        ("name", lock.name),
        ("type", lock.type),
        ("manifest", lock.manifest),
        ("manifest-digest", lock.manifest_digest),
        ("uv", lock.uv),
    ):
        doc.add(key, value)
    python = tomlkit.table()
    for key in ("implementation", "version", "platform", "source", "store"):
        python.add(key, getattr(lock.python, key))
    doc.add(tomlkit.nl())
    doc.add("python", python)
    environment = tomlkit.table()
    environment.add("store", lock.environment.store)
    doc.add("environment", environment)
    if lock.targets:
        targets = tomlkit.aot()
        for target in lock.targets:
            table = tomlkit.table()
            for key in ("platform", "source", "python", "environment"):
                table.add(key, getattr(target, key))
            targets.append(table)
        doc.add("targets", targets)
    for key, packages in (("packages", lock.packages), ("build-packages", lock.build_packages)):
        if packages:
            aot = tomlkit.aot()
            for package in sorted(packages, key=lambda p: (p.name, p.version, p.marker, p.platforms)):
                table = tomlkit.table()
                table.add("name", package.name)
                table.add("version", package.version)
                table.add("index", package.index)
                if package.marker:
                    table.add("marker", package.marker)
                if package.platforms:
                    table.add("platforms", list(package.platforms))
                if package.build_requires:
                    table.add("build-requires", sorted(package.build_requires))
                if package.wheels:
                    wheels = tomlkit.array()
                    wheels.multiline(True)
                    for wheel in sorted(package.wheels, key=lambda w: w.file):
                        wheels.append(inline(file_of(wheel)))
                    table.add("wheels", wheels)
                if package.sdist is not None:
                    table.add("sdist", inline(file_of(package.sdist)))
                aot.append(table)
            doc.add(key, aot)
    if lock.sources:
        sources = tomlkit.aot()
        for source in lock.sources:
            table = tomlkit.table()
            for field in ("name", "repo", "rev", "commit", "tree", "install", "subdirectory", "store"):
                value = getattr(source, field)
                if value is not None:
                    table.add(field, value)
            if not source.build_isolation:
                table.add("build-isolation", False)
            if source.build_requires:
                table.add("build-requires", sorted(source.build_requires))
            if source.submodules:
                submodules = tomlkit.array()
                submodules.multiline(True)
                for sub in source.submodules:
                    submodules.append(inline({"path": sub.path, "url": sub.url, "commit": sub.commit}))
                table.add("submodules", submodules)
            sources.append(table)
        doc.add("sources", sources)
    if lock.weights:
        weights = tomlkit.aot()
        for weight_set in lock.weights:
            table = tomlkit.table()
            for field in ("dir", "provider", "repo", "repo_type", "revision", "store"):
                value = getattr(weight_set, field)
                if value is not None and not (field == "repo_type" and value == "model"):
                    table.add(field, value)
            files = tomlkit.array()
            files.multiline(True)
            for f in sorted(weight_set.files, key=lambda f: f.path):
                entry: dict[str, object] = {"path": f.path, "size": f.size, "sha256": f.sha256}
                if f.revision is not None:
                    entry["revision"] = f.revision
                files.append(inline(entry))
            table.add("files", files)
            weights.append(table)
        doc.add("weights", weights)
    return tomlkit.dumps(doc)


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_PATH = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}(/[a-z0-9_-]{1,6}){0,2}", fullmatch=True).filter(
    lambda p: ".." not in p.split("/")
)
_SHA = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
_STORE = st.one_of(st.just(""), st.just("0" * 32 + "-x"))
_FILES = st.builds(
    LockedFile,
    file=st.from_regex(r"[a-z][a-z0-9_.+-]{0,20}\.whl", fullmatch=True),
    size=st.integers(0, 2**40),
    sha256=_SHA,
    store=_STORE,
)
_PACKAGES = st.lists(
    st.builds(
        LockedPackage,
        name=_TEXT,
        version=_TEXT,
        index=_TEXT,
        marker=_TEXT,
        platforms=st.lists(_TEXT, max_size=2),
        wheels=st.lists(_FILES, max_size=3),
        sdist=st.one_of(st.none(), _FILES),
        build_requires=st.lists(_TEXT, max_size=2),
    ),
    max_size=3,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    packages=_PACKAGES,
    build_packages=_PACKAGES,
    targets=st.lists(
        st.builds(LockedTarget, platform=_TEXT, source=st.sampled_from(["uv-managed", "host"]), python=_STORE),
        max_size=2,
    ),
    sources=st.lists(
        st.builds(
            LockedSource,
            name=_TEXT,
            repo=_TEXT,
            rev=_TEXT,
            commit=st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
            tree=_SHA.map(lambda h: "blake3:" + h),
            install=st.sampled_from(["editable", "regular", "path", "none"]),
            subdirectory=st.one_of(st.none(), _PATH),
            build_isolation=st.booleans(),
            build_requires=st.lists(_TEXT, max_size=2),
            submodules=st.lists(
                st.builds(
                    LockedSubmodule, path=_PATH, url=_TEXT, commit=st.from_regex(r"[0-9a-f]{40}", fullmatch=True)
                ),
                max_size=2,
            ),
        ),
        max_size=2,
    ),
    weights=st.lists(
        st.builds(
            LockedWeights,
            dir=_PATH,
            provider=st.sampled_from(["huggingface_model", "modelscope_model", "url", "path"]),
            repo=_TEXT,
            revision=st.one_of(st.none(), _TEXT),
            repo_type=st.sampled_from(["model", "dataset"]),
            files=st.lists(
                st.builds(
                    LockedWeightFile,
                    path=_PATH,
                    size=st.integers(0, 2**40),
                    sha256=_SHA,
                    revision=st.one_of(st.none(), _TEXT),
                ),
                max_size=2,
            ),
        ),
        max_size=2,
    ),
    name=_TEXT,
    uv=_TEXT,
)
def test_dumps_gives_the_bytes_tomlkit_gave(
    packages: list[LockedPackage],
    build_packages: list[LockedPackage],
    targets: list[LockedTarget],
    sources: list[LockedSource],
    weights: list[LockedWeights],
    name: str,
    uv: str,
) -> None:
    """Every kind of entry a lock holds, with strings holding quotes, backslashes, control
    characters and other scripts: the same bytes as the tomlkit document, and TOML that reads
    back to the same values."""
    lock = _lock(
        store_paths=False,
        name=name,
        uv=uv,
        packages=packages,
        build_packages=build_packages,
        targets=targets,
        sources=sources,
        weights=weights,
    )
    text = dumps(lock)
    assert text == _tomlkit_dumps(lock)
    data = tomllib.loads(text)
    assert (data["name"], data["uv"]) == (name, uv)
    assert [p["marker"] for p in data.get("packages", []) if "marker" in p] == [
        p.marker for p in sorted(packages, key=lambda p: (p.name, p.version, p.marker, p.platforms)) if p.marker
    ]


def test_toml_text_of_each_value() -> None:
    """The escapes TOML 1.0 reads (tomllib), and keys bare only when they can be."""
    from harness.lock import tomltext

    tricky = 'a"b\\c\n\t\x00\x1b\x7f é\u2028'
    assert tomltext.string(tricky) == '"a\\"b\\\\c\\n\\t\\u0000\\u001b\\u007f é\u2028"'
    assert tomllib.loads(f"x = {tomltext.string(tricky)}")["x"] == tricky
    assert tomltext.value([True, 3, {"k": "v", "a b": []}]) == '[true, 3, {k = "v", "a b" = []}]'
    assert tomltext.key("build-isolation") == "build-isolation" and tomltext.key("") == '""'
    assert tomltext.multiline_array([]) == "[]"
    assert tomltext.multiline_array([1, 2]) == "[\n    1,\n    2,\n]"
    with pytest.raises(TypeError):
        tomltext.value(1.5)


def test_a_path_source_is_exported_as_a_checkout_not_a_package() -> None:
    """``install = "path"`` puts a checkout on sys.path: no installer's format can say that, so
    an export lists it with the checkouts, never as a package to install."""
    from harness.lock.export import unexported

    [source] = _lock().sources
    lock = _lock(sources=[source.model_copy(update={"install": "path"})])
    assert unexported(lock, "requirements") == ["checkout(s) tool as comments", "weights arm as comments"]
    assert unexported(_lock(), "requirements")[0] == "git source(s) tool as commented lines to install separately"
