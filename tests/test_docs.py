"""The documentation site is checked like code.

* the generated reference pages match the code (``scripts/docs.py --check``), and every model
  field and settings key has the description the generator needs (it refuses one without);
* every settings table, key and variable ``harness/config.py`` reads has its row in the
  generated settings reference;
* every internal link of every page (and of the README) names a page that exists;
* every ``harness …`` command line in a shell snippet names a real command and real options;
* with the site built (``HARNESS_DOCS_DIST``, set by ``scripts/docs-site.sh`` in CI), headless
  Chromium opens the home page and a guide, and each renders its title and navigation.
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib.util
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTENT = ROOT / "docs" / "src" / "content" / "docs"


def _docs_module() -> Any:
    spec = importlib.util.spec_from_file_location("harness_docs_generator", ROOT / "scripts" / "docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted([*CONTENT.rglob("*.md"), *CONTENT.rglob("*.mdx")])


def _slug(page: Path) -> str:
    rel = page.relative_to(CONTENT).with_suffix("").as_posix()
    return "" if rel == "index" else rel.removesuffix("/index")


def test_generated_reference_pages_are_current() -> None:
    docs = _docs_module()
    stale = docs.stale(docs.render())
    assert stale == [], f"stale generated pages {stale}: run `python scripts/docs.py`"


def test_a_model_field_without_a_description_fails_the_generator() -> None:
    from pydantic import BaseModel, Field

    class Documented(BaseModel):
        said: int = Field(default=1, description="what it does")
        unsaid: int = 2

    with pytest.raises(ValueError, match=r"Documented\.unsaid has no description"):
        _docs_module()._model_section(Documented, "Documented")


def test_a_settings_field_without_metadata_fails_the_generator() -> None:
    import dataclasses

    @dataclasses.dataclass
    class Undocumented:
        newly_added: int = 3

    with pytest.raises(ValueError, match=r"Settings\.newly_added has no reference metadata"):
        _docs_module().settings_keys(Undocumented)


def _config_tables_read() -> set[str]:
    """The top-level tables ``harness/config.py`` reads from a settings file: the string
    constants of every call that reads the parsed document (``data.get("cache")``,
    ``_checked_table(data, path, "gc", ...)``)."""
    import ast

    tables = set()
    for node in ast.walk(ast.parse((ROOT / "harness" / "config.py").read_text())):
        if not isinstance(node, ast.Call):
            continue
        on_data = any(isinstance(a, ast.Name) and a.id == "data" for a in node.args) or (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "data"
        )
        if on_data:
            tables |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return tables


def test_every_settings_table_the_loader_reads_is_documented() -> None:
    documented = {k["table"].split(".")[0] for k in _docs_module().settings_keys()}
    read = _config_tables_read()
    assert {"indexes", "cache", "gc"} <= read, f"the table scan found too little: {read}"
    assert read - documented == set(), (
        f"settings tables read by harness/config.py without reference: {read - documented}"
    )


def _valid_keys(table: str, tmp_path: Path) -> list[str] | None:
    """The keys ``load_settings`` names as valid when ``[table]`` holds an unknown one; None
    when the table takes any key (a table of names)."""
    from harness.config import load_settings
    from harness.errors import InputError

    home = tmp_path / table
    home.mkdir()
    (home / "config.toml").write_text(f'[{table}]\n"surely-no-such-key" = "file:///x/"\n')
    try:
        load_settings(home)
    except InputError as exc:
        text = str(exc)
        for marker in ("valid keys: ", "known: "):
            if marker in text:
                return [k.strip() for k in text.split(marker, 1)[1].split("\n")[0].split(",")]
        return None
    return None


def test_every_settings_key_the_loader_accepts_is_documented(tmp_path: Path) -> None:
    # The loader refuses an unknown key naming the valid ones: each must have its row in the
    # generated settings reference (sub-tables such as [lock.python] count as keys of [lock]).
    keys = _docs_module().settings_keys()
    checked = 0
    for table in sorted({k["table"] for k in keys}):
        valid = _valid_keys(table, tmp_path)
        rows = [k["key"] for k in keys if k["table"] == table]
        if valid is None:
            assert all(not re.fullmatch(r"[a-z][a-z-]*", r) for r in rows), (
                f"[{table}] takes any key, yet its reference names a fixed one: {rows}"
            )
            continue
        checked += 1
        subtables = {k["table"].split(".", 1)[1] for k in keys if k["table"].startswith(table + ".")}
        documented = {w for r in rows for w in re.findall(r"`?([a-z][a-z-]*)`?", r)} | subtables
        missing = [k for k in valid if k not in documented]
        assert missing == [], f"[{table}] accepts {missing}, which the settings reference does not name"
    assert checked >= 4, "the unknown-key probe found too few checked tables"


def test_every_settings_variable_is_documented() -> None:
    import ast

    env_text = " ".join(k["env"] for k in _docs_module().settings_keys())
    names = {
        n.value
        for n in ast.walk(ast.parse((ROOT / "harness" / "config.py").read_text()))
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and re.fullmatch(r"(HARNESS|UV|HF)_[A-Z0-9_]*", n.value)
    }
    assert "HARNESS_GC_KEEP_RUNS" in names
    missing = sorted(n for n in names if n not in env_text)
    assert missing == [], f"harness/config.py reads {missing}, which the settings reference does not name"


def test_every_gpu_manifest_says_where_its_vram_figure_comes_from() -> None:
    # The services reference marks each VRAM figure measured or estimate from the manifest's
    # "# - vram_gb: ..." note; a GPU service without one would be listed as neither.
    import tomllib

    docs = _docs_module()
    silent = []
    for path in sorted([*(ROOT / "services").glob("*.toml"), *(ROOT / "benchmarks").glob("*.toml")]):
        vram = tomllib.loads(path.read_text()).get("vram_gb", 0)
        if vram and not docs._comment_note(path, "vram_gb"):
            silent.append(path.relative_to(ROOT).as_posix())
    assert silent == [], f"say where vram_gb comes from in a '# - vram_gb: ...' note (measured or estimate): {silent}"


def test_every_cli_option_says_what_it_does() -> None:
    # The CLI reference's "meaning" column is each option's help: an option without one is an
    # empty cell a reader cannot act on.
    from harness.cli import cli

    ctx = click.Context(cli, info_name="harness")
    bare: list[str] = []

    def walk(command: click.Command, path: list[str]) -> None:
        bare.extend(
            f"{' '.join(path)} {param.opts[0]}"
            for param in command.params
            if isinstance(param, click.Option) and not param.hidden and not param.help
        )
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])

    walk(cli, ["harness"])
    assert bare == [], f"options without help= text: {bare}"


def test_every_harness_variable_is_documented() -> None:
    # The configuration reference lists the variables harness reads or sets; the generated
    # settings reference lists those that set a key.
    import ast

    pages = "".join((CONTENT / "reference" / name).read_text() for name in ("configuration.md", "settings.md"))
    names = {
        node.value
        for path in (ROOT / "harness").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"HARNESS_[A-Z0-9_]*[A-Z0-9]", node.value)
    }
    assert "HARNESS_HOME" in names
    missing = sorted(n for n in names if n not in pages)
    assert missing == [], f"harness reads or sets {missing}, which reference/configuration.md does not list"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(CONTENT).as_posix())
def test_titles_are_plain_text(page: Path) -> None:
    # Starlight prints a title as text in the sidebar and the tab: markdown there shows its marks.
    title = re.search(r"^title: (.*)$", page.read_text(), flags=re.M)
    assert title is not None, f"{page.relative_to(ROOT)} has no title"
    assert not re.search(r"[`*\[]", title.group(1)), f"{page.relative_to(ROOT)}: markdown in its title"


def test_the_seed_pages_exist() -> None:
    # The seed (shared/seeds/001) sends readers to these pages.
    for slug in [
        "guides/small-machine",
        "guides/add-a-vla",
        "guides/manage-services",
        "guides/evaluation-through-xpolicylab",
        "reference/services",
        "reference/configuration",
    ]:
        assert any(_slug(p) == slug for p in _pages()), f"no page {slug}"


_LINK = re.compile(r"\]\((/[^)#\s]*)(#[^)\s]*)?\)")
_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+:|/|#)([^)\s]+)\)")


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(CONTENT).as_posix())
def test_internal_links_resolve(page: Path) -> None:
    slugs = {_slug(p) for p in _pages()}
    text = page.read_text()
    broken = [target for target, _ in _LINK.findall(text) if target.strip("/") not in slugs]
    # A relative link ("guides/runtime.md") resolves against the page's own URL on the built
    # site, so it breaks; pages link by site path ("/guides/runtime/").
    broken += _RELATIVE_LINK.findall(text)
    assert broken == [], f"{page.relative_to(ROOT)} links to missing pages {broken}"


def _shell_lines(text: str) -> Iterator[str]:
    """Lines of ```sh / ```console / ```bash fences, comments stripped, continuations joined."""
    for block in re.findall(r"```(?:sh|bash|console|shell)\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip().removeprefix("$ ")
            if line and not line.startswith("#"):
                yield from (part.strip() for part in re.split(r"&&|;|\|", line))


def _resolve(words: list[str]) -> tuple[list[str], click.Command | None, list[tuple[str, click.Command]]]:
    """Walk ``harness WORDS`` through the click tree: (path, command reached, each option word
    with the command or group it was given to: a global option goes before the command)."""
    from harness.cli import cli

    ctx = click.Context(cli, info_name="harness")
    command: click.Command = cli
    path = ["harness"]
    options: list[tuple[str, click.Command]] = []
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if word == "--":
            break  # what follows is the command's COMMAND
        if word.startswith("-") and word != "-":
            options.append((word.split("=")[0], command))
            if rest and (rest[0] == "-" or not rest[0].startswith("-")) and _takes_value(command, word):
                rest.pop(0)
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(ctx, word)
            if sub is None:
                return path + [word], None, options
            command = sub
            path.append(word)
            ctx = click.Context(command, info_name=word, parent=ctx)
            continue
        if command.context_settings.get("ignore_unknown_options"):
            break  # an argument of a command that passes what follows on (run's COMMAND)
        # an argument: options may still follow it (click reads them anywhere)
    return path, command, options


def _takes_value(command: click.Command, word: str) -> bool:
    for param in command.params:
        if isinstance(param, click.Option) and word.split("=")[0] in [*param.opts, *param.secondary_opts]:
            return not param.is_flag and "=" not in word
    return False


def _option_words(command: click.Command) -> set[str]:
    """The option words ``command`` itself takes (a group's are its own, not its commands')."""
    words = {o for p in command.params if isinstance(p, click.Option) for o in [*p.opts, *p.secondary_opts]}
    return words | {"-h", "--help"}


def _snippet_sources() -> list[Path]:
    return [*_pages(), ROOT / "README.md"]


@pytest.mark.parametrize("page", _snippet_sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_harness_commands_in_snippets_exist(page: Path) -> None:
    from harness.cli import cli

    problems = []
    for line in _shell_lines(page.read_text()):
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if not words or words[0] != "harness":
            continue
        path, command, options = _resolve(words[1:])
        if command is None:
            problems.append(f"{line!r}: no command {' '.join(path)}")
            continue
        unknown = [o for o, owner in options if o not in _option_words(owner)]
        if unknown:
            misplaced = [o for o in unknown if o in _option_words(cli)]
            problems.append(
                f"{line!r}: {' '.join(path)} has no option {unknown}"
                + (f" ({misplaced} global: harness {misplaced[0]} … {' '.join(path[1:])})" if misplaced else "")
            )
        given = {o for o, _ in options}
        missing = [
            p.opts[0] for p in command.params if isinstance(p, click.Option) and p.required and not set(p.opts) & given
        ]
        if missing and "--help" not in given:
            problems.append(f"{line!r}: {' '.join(path)} needs {missing}")
    assert problems == [], f"{page.relative_to(ROOT)}: " + "; ".join(problems)


# --------------------------------------------------------------------- the built site


def _dist() -> Path:
    value = os.environ.get("HARNESS_DOCS_DIST")
    if not value:
        pytest.skip("the site is not built here: scripts/docs-site.sh builds it and sets HARNESS_DOCS_DIST")
    dist = Path(value)
    assert (dist / "index.html").is_file(), f"{dist} holds no built site"
    return dist


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.skip("no headless Chromium here (CI installs Debian's chromium)")


# A page that loads a page of the site in a 1280 px wide frame and writes, once it has laid
# out, each code block that is wider than its box (its text runs under the copy button and
# needs a scroll bar) into #result: headless Chromium's --dump-dom prints it.
_FIT_PROBE = """<!doctype html><html><body>
<iframe id="page" style="width:1280px;height:900px;border:0"></iframe><pre id="result">pending</pre>
<script>
const frame = document.getElementById("page");
frame.onload = () => {
  const doc = frame.contentDocument;
  const wide = [...doc.querySelectorAll("pre")]
    .filter((pre) => pre.scrollWidth > pre.clientWidth + 1)
    .map((pre) => ({width: pre.scrollWidth, box: pre.clientWidth, text: pre.textContent.slice(0, 80)}));
  document.getElementById("result").textContent = JSON.stringify(wide);
};
frame.src = new URLSearchParams(location.search).get("page");
</script></body></html>"""


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/__fit.html"):
            body = _FIT_PROBE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    dist = _dist()
    handler = functools.partial(_SiteHandler, directory=str(dist))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,900",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _png_colours(path: Path) -> int:
    """How many distinct pixel values a PNG holds (a blank page has one or two)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, width, height, channels = 8, b"", 0, 0, 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8, "8-bit PNGs only"
            channels = {2: 3, 6: 4, 0: 1, 4: 2}[colour]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    colours: set[bytes] = set()
    previous = bytearray(stride)
    for row in range(height):
        offset = row * (stride + 1)
        kind, line = raw[offset], bytearray(raw[offset + 1 : offset + 1 + stride])
        for i in range(stride):  # undo the PNG row filters
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
        if row % 8 == 0:
            colours.update(bytes(line[i : i + channels]) for i in range(0, stride, channels * 4))
        previous = line
    return len(colours)


@pytest.mark.parametrize(("path", "title"), [("/", "harness"), ("/guides/small-machine/", "A small machine")])
def test_built_pages_render_in_chromium(site_url: str, path: str, title: str, tmp_path: Path) -> None:
    url = site_url + path
    dom = _browser("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"<title>{title}" in dom.stdout, f"{url}: no title {title!r}"
    assert "<nav" in dom.stdout and "Getting started" in dom.stdout, f"{url}: no navigation"
    shots = Path(os.environ.get("HARNESS_DOCS_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / (("home" if path == "/" else path.strip("/").replace("/", "-")) + ".png")
    result = _browser(f"--screenshot={shot}", url)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    assert _png_colours(shot) > 16, f"{shot}: the page rendered blank"


@pytest.mark.parametrize("path", ["/", "/guides/getting-started/"])
def test_code_blocks_fit_the_page_at_1280px(site_url: str, path: str) -> None:
    """At 1280 px (a laptop), no code block of the home page or the first guide is wider than
    its box: the pipeline diagram once ran under its copy button."""
    dom = _browser("--virtual-time-budget=15000", "--dump-dom", f"{site_url}/__fit.html?page={path}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="result">(.*?)</pre>', dom.stdout, flags=re.S)
    assert found is not None and found.group(1) != "pending", f"{path}: the probe did not run: {dom.stdout[-500:]}"
    wide = json.loads(html.unescape(found.group(1)))
    assert wide == [], f"{path}: code blocks wider than the page at 1280 px: {wide}"


# -- flags render as typed -------------------------------------------------------------------

# A command-line flag in prose or a table: Starlight's smartypants turns its "--" into an em
# dash ("—flag") everywhere but in code, so every flag on a page is written in a code span.
FLAG = re.compile(r"(?<![\w/-])--[A-Za-z][\w-]*")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def _markdown_blocks(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each block of a markdown page that is not code: front
    matter, fenced blocks and indented code blocks left out; blocks split at blank lines (a
    code span may run over the lines of its paragraph, never beyond)."""
    lines = text.splitlines()
    start = 0
    if lines and lines[0].strip() == "---":
        start = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
    fence: str | None = None
    block: list[str] = []
    first = 0
    for number, line in enumerate(lines[start:], start + 1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            continue
        if opening or not line.strip() or (not block and line.startswith(("    ", "\t"))):
            if block:
                yield first, "\n".join(block)
            block = []
            fence = opening.group(1) if opening else None
            continue
        if not block:
            first = number
        block.append(line)
    if block:
        yield first, "\n".join(block)


def _flags_outside_code(text: str) -> list[tuple[int, str]]:
    """Each ``--flag`` of a markdown page outside code spans, code blocks and HTML comments
    (which do not render: tests/test_guide_commands.py's markers live there), by line."""
    found = []
    for first, block in _markdown_blocks(text):
        prose = CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), block)
        prose = re.sub(r"<code>.*?</code>", "", prose, flags=re.DOTALL)
        prose = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), prose, flags=re.DOTALL)
        for number, line in enumerate(prose.splitlines(), first):
            found.extend((number, flag) for flag in FLAG.findall(line))
    return found


def test_the_flag_check_finds_flags_in_prose_only() -> None:
    page = (
        "---\ntitle: x --y\n---\n\nRun `harness lock\n--check` or --check,\n\n"
        "```sh\nharness lock --check\n```\n\n    harness run --agent a\n\n"
        "| `--set` | a --set b |\n\nsee ``a `--b` c`` and <code>--d</code> or --e-f.\n"
        "\n<!-- not rendered: --g -->\n"
    )
    assert _flags_outside_code(page) == [(6, "--check"), (14, "--set"), (16, "--e-f")]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_flags_are_in_code_spans(page: Path) -> None:
    """Every ``--flag`` on a docs page is in a code span or block, so it renders as typed
    (outside code the site's smartypants makes "--flag" an em dash, "—flag"). A generated
    reference page is fixed in scripts/docs.py, which puts the code's flags in code spans."""
    found = _flags_outside_code(page.read_text())
    assert found == [], f"{page.relative_to(ROOT)}: " + ", ".join(f"line {n}: {flag}" for n, flag in found)
