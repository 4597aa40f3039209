"""CI helper (run as root): give an unprivileged user the interpreters the committed locks
pin, when only root can run them.

CI machines carry their Pythons in root's pyenv (``/root/.pyenv``, mode 0700), which no other
user can reach; a researcher has their own (``~/.pyenv/versions``, where harness looks). This
copies the interpreter, its shared libpython and its standard library (no site-packages) to
``<home>/.pyenv/versions/<version>`` and points its RUNPATH, which pyenv sets to the absolute
``<prefix>/lib``, at ``$ORIGIN/../lib`` so the copy runs where it is (its sysconfig data names the copy's prefix).

Usage: python user_python.py USER_HOME VERSION... (prints each copy's python3 path)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def runs_as(python: Path, version: str) -> bool:
    try:
        out = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except OSError:
        return False
    return out == version


def copy(prefix: Path, dest: Path, version: str) -> None:
    minor = ".".join(version.split(".")[:2])
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(prefix / "bin" / f"python{minor}", dest / "bin" / f"python{minor}")
    os.symlink(f"python{minor}", dest / "bin" / "python3")
    shutil.copytree(prefix / "lib" / f"python{minor}", dest / "lib" / f"python{minor}", symlinks=True,
                    ignore=lambda folder, names: {"site-packages", "__pycache__", "test"} & set(names))
    (dest / "lib" / f"python{minor}" / "site-packages").mkdir()
    for lib in (prefix / "lib").glob("libpython*"):
        if lib.is_symlink():
            os.symlink(os.readlink(lib), dest / "lib" / lib.name)
        else:
            shutil.copy2(lib, dest / "lib" / lib.name)
    if (prefix / "include").is_dir():
        shutil.copytree(prefix / "include", dest / "include", symlinks=True)
    # sysconfig names the original prefix (LIBDIR, INCLUDEPY...): name the copy's instead.
    for data_file in (dest / "lib" / f"python{minor}").glob("_sysconfigdata_*.py"):
        data_file.write_text(data_file.read_text().replace(str(prefix), str(dest)))
    old = str(prefix / "lib").encode()
    new = b"$ORIGIN/../lib"
    exe = dest / "bin" / f"python{minor}"
    data = exe.read_bytes()
    if old + b"\0" in data:  # a NUL-terminated dynamic string: a shorter one fits, NUL-padded
        exe.write_bytes(data.replace(old + b"\0", new + b"\0" * (len(old) - len(new) + 1), 1))


def main() -> int:
    home = Path(sys.argv[1])
    root = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
    for version in sys.argv[2:]:
        dest = home / ".pyenv" / "versions" / version
        minor = ".".join(version.split(".")[:2])
        if runs_as(Path(f"/usr/bin/python{minor}"), version) or (dest / "bin" / "python3").exists():
            continue
        if not (root / version).is_dir():
            print(f"ci: no Python {version} to give the user", file=sys.stderr)
            continue
        copy(root / version, dest, version)
        print(dest / "bin" / "python3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
