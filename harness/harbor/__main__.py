"""``python -m harness.harbor pin TASK...``: pin tasks to the store path their lock realizes to.

For a task whose ``environment/harness.toml`` names a ``manifest`` (or a ``lock``), writes
``environment = "<the lock's environment store path>"`` into that file (keeping its comments
and other keys), so Harbor's task digest changes exactly when the environment does. Prints
one line per task: the pin, and whether it changed. Needs no Harbor.

``python -m harness.harbor check TASK...`` prints what each task resolves to without
realizing anything (exit 1 when a pin drifted or a path is missing).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.errors import HarnessError


def _lock_of(task: Path):
    from harness.harbor.resolve import _project
    from harness.harbor.spec import read_spec
    from harness.lock.lockfile import lock_path, read

    spec = read_spec(task / "environment")
    if spec.manifest:
        return spec, read(lock_path(_project(spec, task).locks_dir, spec.manifest))
    if spec.lock:
        return spec, read(spec.lock)
    return spec, None


def pin(task: Path) -> str:
    import tomlkit

    from harness.harbor.spec import FILE_NAME

    spec, lock = _lock_of(task)
    if lock is None:
        raise HarnessError(f"{task}: names a bare store path ({spec.environment}); nothing to pin from")
    path = task / "environment" / FILE_NAME
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    old = doc.get("environment")
    doc["environment"] = lock.environment.store
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")
    state = "unchanged" if old == lock.environment.store else (f"was {old}" if old else "new")
    return f"{task}: environment = {lock.environment.store} ({state})"


def check(task: Path, home: Path) -> tuple[bool, str]:
    from harness.realize.builder import lock_objects
    from harness.store.store import Store

    spec, lock = _lock_of(task)
    store = Store.in_home(home)
    if lock is None:
        ok = store.is_registered(spec.environment or "")
        return ok, f"{task}: {spec.describe()} ({'realized' if ok else 'not realized'})"
    if spec.environment and spec.environment != lock.environment.store:
        return False, f"{task}: drifted: pins {spec.environment}, the lock realizes to {lock.environment.store}"
    missing = [n for n in lock_objects(lock) if not store.is_registered(n)]
    state = "realized" if not missing else f"{len(missing)} store path(s) not realized (realized on first use)"
    return not missing, f"{task}: {spec.describe()} -> {lock.environment.store}: {state}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.harbor", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pin", "check"):
        one = sub.add_parser(name)
        one.add_argument("tasks", nargs="+", type=Path)
        one.add_argument("--home", help="HARNESS_HOME (check only)")
    args = parser.parse_args(argv)
    home = Path(args.home or os.environ.get("HARNESS_HOME") or "~/.cache/harness").expanduser()
    status = 0
    for task in args.tasks:
        try:
            if args.command == "pin":
                print(pin(task))
            else:
                ok, line = check(task, home)
                print(line)
                status |= 0 if ok else 1
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
