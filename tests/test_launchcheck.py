"""The launch check: every file a process starts from is what the store registered."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.runtime.launch import LaunchSpec
from harness.runtime.supervisor import ServiceStartError, start
from harness.store import fingerprint, statfile
from harness.store.launchcheck import IntegrityError, check_closure, read_launches
from harness.store.store import Store


def _tree(files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    def build(out: Path) -> None:
        for rel, data in files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)

    return build


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def _writable(path: Path) -> None:
    path.parent.chmod(0o755)
    path.chmod(0o644)


def test_a_registered_path_is_verified_by_its_fingerprint(store: Store) -> None:
    record = store.add("a" * 32 + "-weights", "weights", _tree({"w/model.bin": b"x" * 4096, "config": b"{}"}))
    [check] = check_closure(store.root, [record.name])
    assert (check.path, check.content, check.verified) == (record.name, record.content, "stat")


def test_a_write_of_the_same_size_is_refused_naming_the_file(store: Store) -> None:
    record = store.add("b" * 32 + "-weights", "weights", _tree({"w/model.bin": b"x" * 4096}))
    target = store.root / record.name / "w" / "model.bin"
    _writable(target)
    target.write_bytes(b"y" * 4096)
    os.utime(target, (1, 1))  # mtime back to the store's: the ctime still tells
    with pytest.raises(IntegrityError) as caught:
        check_closure(store.root, [record.name])
    assert f"{record.name}/w/model.bin" in caught.value.message
    assert caught.value.expected == record.content and caught.value.found != record.content


def test_an_added_file_is_refused_naming_its_folder(store: Store) -> None:
    record = store.add("c" * 32 + "-src", "source", _tree({"pkg/mod.py": b"x = 1\n"}))
    folder = store.root / record.name / "pkg"
    folder.chmod(0o755)
    (folder / "extra.py").write_text("import os\n")
    with pytest.raises(IntegrityError) as caught:
        check_closure(store.root, [record.name])
    assert f"{record.name}/pkg" in caught.value.files


def test_a_reference_is_checked_too(store: Store) -> None:
    base = store.add("d" * 32 + "-python", "python", _tree({"bin/python": b"#!/bin/sh\n"}))
    env = store.add("e" * 32 + "-env", "environment", _tree({"pyvenv.cfg": b"home = x\n"}), references=(base.name,))
    assert {c.path for c in check_closure(store.root, [env.name])} == {base.name, env.name}
    target = store.root / base.name / "bin" / "python"
    _writable(target)
    target.write_bytes(b"#!/bin/XX\n")
    with pytest.raises(IntegrityError, match=f"{base.name}/bin/python"):
        check_closure(store.root, [env.name])


def test_an_unchanged_path_without_fingerprint_is_rehashed_and_remembered(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = store.add("f" * 32 + "-weights", "weights", _tree({"w.bin": b"w" * 100}))
    statfile.fingerprint_path(store.root, record.name).unlink()
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)  # the files were written just now
    assert check_closure(store.root, [record.name])[0].verified == "hash"
    assert check_closure(store.root, [record.name])[0].verified == "stat"


def test_a_legitimate_ctime_change_costs_a_rehash_not_a_refusal(store: Store) -> None:
    record = store.add("g" * 32 + "-env", "environment", _tree({"lib/a.py": b"a = 1\n"}))
    # Another path hard-linking this file (the .links pool does) changes its ctime only.
    extra = store.root.parent / "other-link"
    os.link(store.root / record.name / "lib" / "a.py", extra)
    extra.unlink()
    assert check_closure(store.root, [record.name])[0].verified == "hash"


def test_an_unregistered_root_is_refused(store: Store) -> None:
    with pytest.raises(IntegrityError, match="no registered path"):
        check_closure(store.root, ["h" * 32 + "-missing"])


def test_supervisor_refuses_to_start_a_changed_closure_and_logs_it(store: Store, tmp_path: Path) -> None:
    record = store.add("i" * 32 + "-weights", "weights", _tree({"w.bin": b"w" * 100}))
    state = tmp_path / "state"
    marker = tmp_path / "started"
    spec = LaunchSpec(
        name="svc",
        argv=(sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
        env=dict(os.environ),
        cwd=tmp_path,
        port=1,
        url="http://127.0.0.1:1",
        health_url=None,
        load_seconds=5,
        log_path=state / "logs" / "svc.log",
        closure=(str(store.root / record.name),),
    )
    proc = start(spec, state)  # unchanged: starts, and the check is logged
    proc.wait(timeout=30)
    assert marker.exists()
    marker.unlink()
    target = store.root / record.name / "w.bin"
    _writable(target)
    target.write_bytes(b"v" * 100)
    with pytest.raises(ServiceStartError, match=f"refusing to launch.*{record.name}/w.bin"):
        start(spec, state)
    assert not marker.exists(), "nothing was started"
    first, second = read_launches(state)
    assert first["launch"] == "svc" and first["paths"][record.name]["verified"] == "stat"
    assert second["refused"]["path"] == record.name and f"{record.name}/w.bin" in second["refused"]["files"]
    assert json.loads(json.dumps(second)) == second
