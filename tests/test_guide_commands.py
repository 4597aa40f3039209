"""Every guide's commands, run (issue 35, step 6): a `harness` line in a guide's shell block
that fails here is a failing test, not a surprise for the reader who types it.

The guides are run in order, page by page, as a reader would type them: in a copy of the
example project, with a home where the example's kinematics and reach are realized and run
once (a host copy of the interpreter stands in here, as on any machine without Python
downloads), and a deploy that puts every service on a free port. The example is run twice:
``RUN`` and ``RUN_B`` stand for the newer run's id, ``RUN_A`` for the older's.

A block that cannot run on a test machine (it needs a GPU, a model from Hugging Face, a
cluster, a path like ``/srv``, or it follows output forever) says so in the page, on the line
before its fence, where writers see it::

    <!-- docs-test: not run: needs a GPU and the sam3 weights -->

Such a block's commands are still checked to exist with the options they use
(tests/test_docs.py). A block with a placeholder (``NAME``, ``[--json]``) and no such line
fails here: a guide says what to type.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, run_harness_process
from tests.ports import free_port

GUIDES = REPO / "docs" / "src" / "content" / "docs" / "guides"
_FENCE = re.compile(r"```(?:sh|bash|console|shell)\n(.*?)```", re.S)
#: What a project holds (the example's manifests, locks, configs and their files).
PROJECT_PARTS = ("harness.toml", "services", "benchmarks", "configs", "locks", "harbor")
_NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run:\s*(\S.*?)\s*-->")
# Commands that follow output until interrupted: refused even in a runnable block.
_FOREVER = ("--watch", "-f", "--follow")


@dataclass(frozen=True)
class Command:
    page: str
    line: str
    words: list[str]


@dataclass(frozen=True)
class Block:
    page: str
    commands: list[Command]
    not_run: str | None  # the reason the page gives, or None: the block runs


def _harness_lines(block: str) -> list[str]:
    joined = block.replace("\\\n", " ")
    lines = []
    for raw in joined.splitlines():
        line = raw.split("  #")[0].split(" # ")[0].strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            parts = (part.split(" | ")[0].strip() for part in re.split(r"&&|;", line))  # a pipe's left side
            lines += [part for part in parts if part.startswith("harness")]
    return lines


def blocks(page: Path, substitute: dict[str, str] | None = None) -> list[Block]:
    """The shell blocks of ``page`` that hold `harness` commands, in order, with the words of
    ``substitute`` replaced."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        reason = _NOT_RUN.search(before[-1]) if before else None
        commands = []
        for line in _harness_lines(match.group(1)):
            substituted = " ".join((substitute or {}).get(word, word) for word in line.split(" "))
            try:
                words = shlex.split(substituted)
            except ValueError:
                words = []
            commands.append(Command(page.name, line, words))
        if commands:
            found.append(Block(page.name, commands, reason.group(1) if reason else None))
    return found


def _placeholder(word: str) -> bool:
    """A word a reader replaces: an upper-case name (RUN, NAMES), an optional part (``[--json]``,
    ``<run>``) or alternatives (``requirements|pylock``)."""
    return (
        bool(re.fullmatch(r"[A-Z][A-Z0-9_]+", word)) or word.startswith(("[", "<")) or ("|" in word and "=" not in word)
    )


def _runnable(command: Command) -> str | None:
    """Why ``command`` cannot be typed as written (None: it can)."""
    if not command.words:
        return "it does not split as a shell line"
    placeholders = [word for word in command.words[1:] if _placeholder(word)]
    if placeholders:
        return f"placeholders {placeholders}"
    if any(word in _FOREVER for word in command.words):
        return "it follows output until interrupted"
    return None


def test_the_block_parser_reads_markers_placeholders_and_chains(tmp_path: Path) -> None:
    page = tmp_path / "guide.md"
    page.write_text(
        "Text.\n\n```sh\nharness validate && harness plan --gpus 1x24   # a comment\nls\n```\n\n"
        "<!-- docs-test: not run: needs a GPU -->\n```sh\nharness up sam3\n```\n\n"
        "```sh\nharness audit RUN --strict\nharness logs -f NAME\nharness runs [--json]\n```\n"
    )
    first, second, third = blocks(page, {"RUN": "latest"})
    assert [c.line for c in first.commands] == ["harness validate", "harness plan --gpus 1x24"]
    assert first.not_run is None and second.not_run == "needs a GPU"
    assert [c.words for c in third.commands][0] == ["harness", "audit", "latest", "--strict"]
    assert [_runnable(c) for c in third.commands] == [
        None,
        "placeholders ['NAME']",
        "placeholders ['[--json]']",
    ]


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, str]]:
    """A copy of the example project (what git sees), the environment a reader has (a home
    with the example realized and run twice, a deploy on free ports) and the run ids the
    placeholders stand for."""
    project = tmp_path_factory.mktemp("project")
    # The project's own folders (a copy without git: CI's unprivileged user has no .git).
    for name in PROJECT_PARTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.is_file():
            shutil.copy2(source, project / name)
    home = tmp_path_factory.mktemp("home")
    deploy = home / "deploy.toml"
    deploy.write_text(
        "".join(f"[services.{name}]\nport = {free_port()}\n" for name in ("kinematics", "sam3", "simate", "molmo2"))
    )
    env = {"HARNESS_HOME": str(home), "HARNESS_DEPLOY": str(deploy)}
    run = ("run", "--agent", "kinematics-only")
    for args in (("realize", "kinematics", "reach"), run, run):
        done = run_harness_process(*args, cwd=project, env=env, timeout=600)
        assert done.returncode == 0, f"harness {' '.join(args)}: {done.stderr[-2000:]}"
    listed = run_harness_process("runs", "--json", cwd=project, env=env)
    newer, older = (row["id"] for row in json.loads(listed.stdout)[:2])
    return project, env, {"RUN": newer, "RUN_A": older, "RUN_B": newer}


def _pages() -> list[Path]:
    return sorted(GUIDES.glob("*.md"))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_every_command_of_the_guide_runs_as_written(
    page: Path, reader: tuple[Path, dict[str, str], dict[str, str]]
) -> None:
    project, env, runs = reader
    failures = []
    ran = 0
    try:
        for block in blocks(page, runs):
            if block.not_run is not None:
                continue
            for command in block.commands:
                why = _runnable(command)
                if why is not None:
                    failures.append(
                        f"{command.line!r} cannot be typed as written ({why}); say why on the line "
                        "before its block: <!-- docs-test: not run: REASON -->"
                    )
                    continue
                done = run_harness_process(*command.words[1:], cwd=project, env=env, timeout=300)
                ran += 1
                if done.returncode != 0:
                    failures.append(f"{command.line!r} exited {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
    finally:
        run_harness_process("down", cwd=project, env=env, timeout=120)  # what an `up` of the page started
    assert failures == [], f"{page.name}:\n" + "\n".join(failures)
    if not any(block.not_run is None for block in blocks(page)):
        pytest.skip(f"{page.name}: no harness command here that runs on a test machine (each block says why)")
    assert ran > 0
