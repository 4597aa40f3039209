"""Settings: where named indexes and hubs live on this machine.

Locks name indexes and hubs; this module maps names to addresses, so the same lock installs
through a mirror by changing configuration, never the lock (DESIGN invariant 4). Layers,
later ones winning:

1. the project's ``harness.toml`` (``[indexes]``, ``[hubs]``, and ``[lock]``: the default
   target ``platform`` and ``[lock.python]`` pins of version requests) — committed, so its
   addresses are only those that are not package registries (a lab's own index, say);
2. the user's ``$HARNESS_HOME/config.toml`` (same tables; in a home a group shares, only when
   the home's owner, root or this user wrote it: :func:`_takes_home_settings`);
3. the environment: ``HARNESS_INDEX_<NAME>`` (name upper-cased, ``-`` and ``.`` as ``_``),
   ``HF_ENDPOINT`` for Hugging Face, ``HARNESS_MODELSCOPE_ENDPOINT`` for ModelScope.

Git mirrors (``[git-mirrors]``): a canonical repository URL, or a prefix of URLs ending in
``/``, mapped to the mirror fetched instead; a later layer wins key by key.

Binary caches (``[cache]``, see ``harness/cache``): ``substituters`` (cache URLs, each may
carry ``?priority=N``), ``trusted-keys`` (``name:base64`` public keys) and
``secret-key-file`` (signs pushes; a relative path is relative to the file that names it).
A later layer's list replaces an earlier one's; the environment's ``HARNESS_SUBSTITUTERS``
and ``HARNESS_TRUSTED_KEYS`` (whitespace-separated) and ``HARNESS_SECRET_KEY_FILE`` win.

Interpreter downloads (``[python]``): ``downloads-json-url`` (a download list in uv's
``--python-downloads-json-url`` format: an http(s):// or file:// address or a path; a relative
path is relative to the file that names it) and ``install-mirror`` (a mirror of the
python-build-standalone releases, uv's ``UV_PYTHON_INSTALL_MIRROR``). realize passes them to
uv when it installs a lock's interpreter; they say where the bytes come from, never which
bytes (the lock pins the version; the list's sha256 checks the archive). The environment's
``HARNESS_PYTHON_DOWNLOADS_JSON_URL`` and ``HARNESS_PYTHON_INSTALL_MIRROR`` win, and uv's own
``UV_PYTHON_DOWNLOADS_JSON_URL`` / ``UV_PYTHON_INSTALL_MIRROR`` are read when harness's are
unset. Locking ignores them: whether a lock's interpreter is ``uv-managed`` follows uv's
built-in list, the same on every machine. ``download-retry-minutes`` (or
``HARNESS_PYTHON_DOWNLOAD_RETRY_MINUTES``) is how long a failed download is remembered before
realize asks uv again (``harness/realize/unreachable.py``).

The index named ``pypi`` with no configured address means uv's own default index, so harness
never writes a registry address anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.errors import InputError

DEFAULT_INDEX = "pypi"
HUBS = ("huggingface", "modelscope")


#: The tables of a settings file, in reference order, and what each is for (``scripts/docs.py``
#: renders them with the keys' :func:`_doc` metadata into the settings reference).
SETTINGS_TABLES: dict[str, str] = {
    "indexes": "Where each named package index lives. Manifests name indexes (`indexes`, "
    "`package-index`); locks keep the name; the address is read here at lock and realize time.",
    "hubs": "Which endpoint each weights hub client talks to.",
    "lock": "What `harness lock` targets. Usually set in the committed `harness.toml`, so everyone "
    "who locks the project locks the same platforms.",
    "lock.python": "Version requests pinned to a patch release (the version only, never where the "
    "interpreter comes from).",
    "git-mirrors": "Where git sources are fetched from instead of their canonical URL (an offline "
    "cluster, a lab mirror). Locks, store paths and the cache's mirrors keep the canonical URL.",
    "cache": "Binary caches: where `realize` looks for store paths before fetching or building, whose "
    "signatures `realize` and `store pull` trust, and the key `store push` signs with. A later layer's "
    "list replaces an earlier one's.",
    "python": "Where uv downloads a lock's interpreter from: they say where the bytes come from, "
    "never which bytes (the lock pins the version; the list's sha256 checks the archive). `realize` "
    "uses them; `lock` does not.",
    "gc": "What `harness store gc` keeps besides what live roots name.",
    "debian-archives": "Where each named Debian archive lives: rootfs templates (`harbor/images/*.toml`) "
    "and their locks name archives; the address is read here at lock and realize time.",
}


def _doc(
    table: str, key: str, type_: str, meaning: str, example: str, *, default: str | None = None, env: str = ""
) -> dict[str, str]:
    """Reference metadata of the settings key ``[table] key`` held by one :class:`Settings` field.

    ``example`` is the TOML line as written under ``[table]``; ``default`` is text (taken from
    the field's default when None); ``env`` names the variables that win over the files.
    ``scripts/docs.py`` renders it, and ``tests/test_docs.py`` fails when a key this module
    reads has none.
    """
    meta = {"table": table, "key": key, "type": type_, "meaning": meaning, "example": example, "env": env}
    return meta if default is None else {**meta, "default": default}


#: Metadata of a field that no settings key sets directly (derived by load_settings).
_DERIVED = {"derived": "yes"}

_URL = "`http(s)://` or `file://` URL"


@dataclass(frozen=True)
class Settings:
    """Index and hub addresses by name; see the module docstring for where they come from.

    Every field carries its settings key's reference metadata (:func:`_doc`), from which
    ``scripts/docs.py`` generates the settings reference.
    """

    indexes: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "indexes",
            "<name>",
            _URL,
            "The address of the index a manifest names `<name>`. Names compare like package names "
            "(case, `-`, `_` and `.` alike). `pypi` left unset is uv's own default index, which harness "
            "never names; any other name a manifest uses must be set, or locking fails naming where.",
            'pytorch-cu128 = "https://mirror.lab.example/pytorch/whl/cu128"',
            default="none (`pypi`: uv's default index)",
            env="`HARNESS_INDEX_<NAME>` (the name upper-cased, `-` and `.` as `_`)",
        ),
    )
    hubs: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "hubs",
            "`huggingface` or `modelscope`",
            _URL,
            "The endpoint that hub's client downloads weights from; unset keeps the client's default. "
            "Other hub names are errors. A lock names the hub, never its address.",
            'huggingface = "https://hf-mirror.lab.example"',
            default="the client's own endpoint",
            env="`HF_ENDPOINT` (huggingface), `HARNESS_MODELSCOPE_ENDPOINT` (modelscope)",
        ),
    )
    #: ``[lock] platform``: the target platform locks default to (uv's vocabulary).
    lock_platform: str | None = field(
        default=None,
        metadata=_doc(
            "lock",
            "platform",
            "string, uv's `--python-platform` vocabulary",
            'The one platform locks resolve wheels for: the same as `platforms = ["…"]`. Set `platform` '
            "or `platforms`, not both. `harness lock --platform X` locks for X alone, once.",
            '# platform = "x86_64-manylinux_2_28"   (one platform; or platforms, not both)',
            default="this machine's platform",
        ),
    )
    #: ``[lock] platforms`` (or ``platform`` alone): every platform one lock holds, in order.
    lock_platforms: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "lock",
            "platforms",
            "non-empty list of strings, no repeats",
            "Every platform one lock holds, the preferred one first; each is resolved on its own and the "
            "lock lists one `[[targets]]` entry per platform. `realize`, launch and audit take the first "
            "platform this machine runs, and name this setting when the lock holds none.",
            'platforms = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]',
            default="`[platform]`",
        ),
    )
    #: Where ``lock_platforms`` was set (``<file>: lock.platforms``), for error messages.
    lock_platforms_origin: str = field(default="", metadata=_DERIVED)
    #: ``[lock.python]``: a version request pinned further, e.g. ``"3.11" = "3.11.7"``.
    python_pins: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "lock.python",
            '`"3.X"` (a manifest\'s `python` request)',
            'string `"3.X.Y"` of the same series',
            "The exact CPython release that version request locks to. Without a pin a lock takes the "
            "newest patch uv can provide, and a re-lock keeps the patch its lock has.",
            '"3.11" = "3.11.7"',
            default="none",
        ),
    )
    #: ``[git-mirrors]``: canonical git URL (or a URL prefix ending in ``/``) → the mirror
    #: fetched instead; locks keep the canonical URL (``harness.resolve.git.fetch_url``).
    git_mirrors: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "git-mirrors",
            "a canonical repository URL, or a URL prefix ending in `/`",
            "git URL (`file://`, `https://`, `ssh://`, `user@host:path`) or an absolute path; a prefix "
            "maps to a prefix",
            "Fetch that repository (or every repository under the prefix: the rest of the URL is appended "
            "to the mirror's) from the mirror instead. The longest matching prefix wins; an exact URL beats "
            "any prefix. Submodule URLs are mapped the same way. A later layer wins key by key.",
            '"https://github.com/XPolicyLab/XPolicyLab" = "file:///srv/git/XPolicyLab.git"',
            default="none",
        ),
    )
    #: ``[debian-archives]``: an archive's name (as templates and their locks say it) → its address.
    debian_archives: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "debian-archives",
            "<name>",
            _URL,
            "The address of the Debian archive a rootfs template names `<name>` (the folder holding "
            "`dists/` and `pool/`). Templates and their locks keep the name, so the same lock realizes "
            "through any mirror; an archive nobody configured is an error naming where to set it.",
            'debian = "http://mirror.lab.example/debian"',
            default="none",
            env="`HARNESS_DEBIAN_ARCHIVE_<NAME>` (the name upper-cased, `-` and `.` as `_`)",
        ),
    )
    #: ``[debian-archives.<name>] keyring``: the OpenPGP keyring that signs the archive's InRelease.
    debian_keyrings: dict[str, Path] = field(
        default_factory=dict,
        metadata=_doc(
            "debian-archives",
            "`<name>.keyring` (with `<name>.url`, in a `[debian-archives.<name>]` table)",
            "path (a binary keyring, as `gpg --export` or `gpg --dearmor` writes), relative to the file that names it",
            "The keys that sign archive `<name>`'s `dists/<suite>/InRelease`: `harness lock` checks the "
            "signature with `gpgv` against this keyring and each Packages index against the sha256 the "
            "signed Release lists before reading it. A path on this machine, never fetched from the archive "
            "(Debian's own: `/usr/share/keyrings/debian-archive-keyring.gpg`, package `debian-archive-keyring`). "
            "An archive with neither `keyring` nor `allow-unsigned` is refused at lock time.",
            '# [debian-archives.debian]\n# url = "http://mirror.lab.example/debian"\n'
            '# keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"',
            default="none: locking from the archive is refused",
            env="`HARNESS_DEBIAN_KEYRING_<NAME>`",
        ),
    )
    #: ``[debian-archives.<name>] allow-unsigned``: lock from an archive whose InRelease is not checked.
    debian_unsigned: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "debian-archives",
            "`<name>.allow-unsigned`",
            "boolean",
            "Lock from archive `<name>` without checking any signature (a local archive you built and "
            "trust by where it lives): the Packages index is read as served, and the lock records "
            '`release = "not verified (allow-unsigned)"`. A `keyring` wins over it.',
            "# allow-unsigned = true",
            default="`false`",
            env="`HARNESS_DEBIAN_UNSIGNED_<NAME>=1`",
        ),
    )
    #: ``[cache] substituters``: binary caches realize and pull read from.
    substituters: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "cache",
            "substituters",
            "list of cache URLs: `file://` or a path, `s3://bucket/prefix`, `http(s)://`",
            "The binary caches `harness realize` asks before fetching upstream or building (a cluster run "
            "pushes to the first writable one for its nodes); `?priority=N` on a URL orders them (lower first). A deploy's `substituters` are "
            "added to these.",
            'substituters = ["file:///nfs/harness-cache", "s3://lab-cache/harness?priority=10"]',
            default="`[]`",
            env="`HARNESS_SUBSTITUTERS` (whitespace-separated)",
        ),
    )
    #: ``[cache] trusted-keys``: public keys whose signatures make a built path trusted.
    trusted_keys: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "cache",
            "trusted-keys",
            "list of `name:base64` ed25519 public keys",
            "A built path (interpreter, environment, weights view) pulled from a cache must carry a "
            "signature by one of them; fixed-output paths (wheels, sources, weights) are checked against "
            "their lock hashes instead. A deploy's `trusted-keys` are added.",
            'trusted-keys = ["lab-1:Base64PublicKey..."]',
            default="`[]`",
            env="`HARNESS_TRUSTED_KEYS` (whitespace-separated)",
        ),
    )
    #: ``[cache] secret-key-file``: the key ``harness store push`` signs with.
    secret_key_file: Path | None = field(
        default=None,
        metadata=_doc(
            "cache",
            "secret-key-file",
            "path, relative to the file that names it",
            "The secret key `harness store push` (and a cluster run's push) signs with; `store push --key FILE` "
            "wins. `harness store keygen NAME` makes a pair.",
            'secret-key-file = "keys/lab-1.secret"',
            default="none (`store push` warns: unsigned built paths are refused by every puller)",
            env="`HARNESS_SECRET_KEY_FILE`",
        ),
    )
    #: ``[python] downloads-json-url``: the interpreter download list uv installs from.
    python_downloads_json_url: str | None = field(
        default=None,
        metadata=_doc(
            "python",
            "downloads-json-url",
            f"{_URL}, or a path relative to the file that names it",
            "The interpreter download list uv installs from (uv's `--python-downloads-json-url` format), "
            "replacing the list built into uv: entries keyed `cpython-<X.Y.Z>-<os>-<arch>-<libc>`, each "
            "with the `url` and `sha256` of a python-build-standalone `install_only` archive.",
            'downloads-json-url = "https://mirror.lab.example/python/download-metadata.json"',
            default="uv's built-in list",
            env="`HARNESS_PYTHON_DOWNLOADS_JSON_URL`; uv's `UV_PYTHON_DOWNLOADS_JSON_URL` only where nothing else sets it",
        ),
    )
    #: ``[python] install-mirror``: where uv fetches python-build-standalone archives.
    python_install_mirror: str | None = field(
        default=None,
        metadata=_doc(
            "python",
            "install-mirror",
            _URL,
            "A mirror of the python-build-standalone releases (uv's `UV_PYTHON_INSTALL_MIRROR`): uv's own "
            "download list, with archives fetched from there.",
            'install-mirror = "https://mirror.lab.example/python-build-standalone/releases/download"',
            default="the releases' own address",
            env="`HARNESS_PYTHON_INSTALL_MIRROR`; uv's `UV_PYTHON_INSTALL_MIRROR` only where nothing else sets it",
        ),
    )

    #: ``[python] download-retry-minutes``: how long realize trusts a failed interpreter
    #: download before it tries again (``harness/realize/unreachable.py``).
    python_download_retry_minutes: float = field(
        default=60.0,
        metadata=_doc(
            "python",
            "download-retry-minutes",
            "number ≥ 0",
            "After uv failed to download a lock's interpreter (no network, an unreachable mirror or list), "
            "`realize`, `up` and `run` use the host copy standing in without asking uv again for this many "
            "minutes; `0` asks every time. Changing a download setting, or `harness realize --refresh`, "
            "asks at once.",
            "download-retry-minutes = 60",
            env="`HARNESS_PYTHON_DOWNLOAD_RETRY_MINUTES`",
        ),
    )

    def python_download_env(self) -> dict[str, str]:
        """The variables that point uv's interpreter downloads where the settings say."""
        env: dict[str, str] = {}
        if self.python_downloads_json_url:
            env["UV_PYTHON_DOWNLOADS_JSON_URL"] = self.python_downloads_json_url
        if self.python_install_mirror:
            env["UV_PYTHON_INSTALL_MIRROR"] = self.python_install_mirror
        return env

    #: ``[gc] keep-runs``: ``store gc`` keeps what the last N runs used (pinned runs always).
    gc_keep_runs: int = field(
        default=10,
        metadata=_doc(
            "gc",
            "keep-runs",
            "whole number ≥ 0",
            "`store gc` keeps every store path the last N run records name, so they stay auditable; "
            "`harness runs pin ID` keeps a run's paths whatever its age. N counts the records that exist: "
            "once `harness runs prune` removed a record, the paths only it named may go. In a shared home "
            "each member's last N count, by who made the run's folder.",
            "keep-runs = 10",
            env="`HARNESS_GC_KEEP_RUNS`",
        ),
    )
    #: ``[gc] missing-project-days``: a registered project folder gone this long stops
    #: rooting its paths (0: only ``store gc --forget-missing`` drops it).
    gc_missing_project_days: float = field(
        default=30.0,
        metadata=_doc(
            "gc",
            "missing-project-days",
            "number ≥ 0",
            "A project that realized here and whose folder is gone (moved, deleted) keeps its last "
            "recorded paths this many days after `gc` first found it gone; `0` keeps them until "
            "`harness store gc --forget-missing`.",
            "missing-project-days = 30",
        ),
    )
    #: ``[gc] keep-wheel-files``: true keeps the package files (wheels, sdists, built wheels) an
    #: environment was installed from; false (the default) drops them once it is registered
    #: and verified, and streams an index's wheels into the environment instead of storing them.
    gc_keep_wheel_files: bool = field(
        default=False,
        metadata=_doc(
            "gc",
            "keep-wheel-files",
            "boolean",
            "Whether the store keeps each package file an environment was installed from (the "
            "`.whl`, sdist and built-wheel store paths) once the environment is registered. "
            "By default (`false`) it does not, as uv keeps no `.whl` beside a venv: the environment "
            "needs none of them to run, verify, push, be pulled or be audited. Online, a wheel from "
            "an index that the store lacks is not fetched into the store at all: the environment's "
            "`uv pip sync` downloads it, checking its sha256 as it streams and unpacking it meanwhile "
            "(the environment's bytes are the same either way), and what a realize did fetch "
            "(sdists, wheels from an index with credentials, build packages) is dropped once the "
            "environment is registered and verified; `store gc` collects what is left. The wheels "
            "built from sdists stay either way: making one again takes a build, and a second "
            "environment installing the same sdist takes it, offline too. A later "
            "environment that installs one of those wheels gets it from uv's cache (the member's "
            "own, in a shared home) where uv has it, offline too (harness notes each streamed "
            "wheel's address beside that cache); offline, a wheel the cache no longer holds is "
            "refused, naming it, and so is `store verify --repair` of an environment (it rebuilds "
            "with a fresh uv cache of its own). `true` keeps them as store paths: a second environment then builds "
            "from the store offline whatever uv's cache holds, another member of a shared home "
            "builds from them, and `store push` puts them in binary caches, for nodes whose host "
            "CPython differs from the pushing machine's and that must build environments there.",
            "keep-wheel-files = true",
            default="`false`",
            env="`HARNESS_GC_KEEP_WHEEL_FILES` (`0`/`1`)",
        ),
    )

    def index_url(self, name: str) -> str | None:
        """The address of index ``name``; None for ``pypi`` left at uv's default.

        Names compare like package names (case, ``-``, ``_`` and ``.`` alike), so an index
        set through ``HARNESS_INDEX_MY_INDEX`` answers to ``my_index`` and ``my-index``.
        An index other than ``pypi`` that nobody configured is an error naming where to set it.
        """
        wanted = normalize_index_name(name)
        for configured, url in self.indexes.items():
            if normalize_index_name(configured) == wanted:
                return url
        if name == DEFAULT_INDEX:
            return None
        env = "HARNESS_INDEX_" + re.sub(r"[-.]", "_", name).upper()
        raise InputError(
            f"index {name!r} has no address on this machine",
            hint=f'set [indexes] {name} = "<url>" in $HARNESS_HOME/config.toml or export {env}',
        )

    def debian_archive(self, name: str) -> str:
        """The address of Debian archive ``name``; an error naming where to set it."""
        for configured, url in self.debian_archives.items():
            if normalize_index_name(configured) == normalize_index_name(name):
                return url.rstrip("/")
        env = "HARNESS_DEBIAN_ARCHIVE_" + re.sub(r"[-.]", "_", name).upper()
        raise InputError(
            f"Debian archive {name!r} has no address on this machine",
            hint=f'set [debian-archives] {name} = "<url>" in $HARNESS_HOME/config.toml or export {env}',
        )

    def debian_trust(self, name: str) -> DebianTrust:
        """How archive ``name``'s InRelease is checked: its keyring, or the explicit opt-out;
        an error naming where to set either when neither is set."""
        wanted = normalize_index_name(name)
        for configured, keyring in self.debian_keyrings.items():
            if normalize_index_name(configured) == wanted:
                return DebianTrust(keyring=keyring)
        if any(normalize_index_name(n) == wanted for n in self.debian_unsigned):
            return DebianTrust(keyring=None)
        env = re.sub(r"[-.]", "_", name).upper()
        raise InputError(
            f"Debian archive {name!r} names no keyring: its InRelease signature cannot be checked",
            hint=f'set keyring = "/usr/share/keyrings/<archive>-keyring.gpg" under [debian-archives.{name}] in '
            f"$HARNESS_HOME/config.toml (or export HARNESS_DEBIAN_KEYRING_{env}); to lock unchecked, "
            f"allow-unsigned = true there (or HARNESS_DEBIAN_UNSIGNED_{env}=1)",
        )

    def hub_endpoint(self, hub: str) -> str | None:
        """The endpoint of ``huggingface`` or ``modelscope``; None keeps the client's default."""
        return self.hubs.get(hub)


@dataclass(frozen=True)
class DebianTrust:
    """How a Debian archive's InRelease is checked: against ``keyring``, or (None) not at all,
    as the user chose with ``allow-unsigned``."""

    keyring: Path | None


def normalize_index_name(name: str) -> str:
    """``My_Index`` and ``my-index`` name the same index (PEP 503-style normalization)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def load_settings(home: Path, project_root: Path | None = None) -> Settings:
    """Merge project, user and environment settings (later wins).

    The settings files (:func:`_settings_files`) are read in order, each checked whole as it
    is merged; the environment's variables come last. Raises :class:`InputError` naming the
    file and key (or the variable) of the first bad value.
    """
    merged = _Merged()
    for path in _settings_files(home, project_root):
        merged.add_file(path)
    merged.add_environment()
    return merged.settings()


def _settings_files(home: Path, project_root: Path | None) -> list[Path]:
    """The settings files that exist, in merge order: the project's ``harness.toml``, then
    ``$HARNESS_HOME/config.toml``."""
    layers = []
    if project_root is not None and (project_root / "harness.toml").is_file():
        layers.append(project_root / "harness.toml")
    if (home / "config.toml").is_file() and _takes_home_settings(home / "config.toml"):
        layers.append(home / "config.toml")
    return layers


_PASSED_BY: set[Path] = set()  # warned once per process


def _takes_home_settings(path: Path) -> bool:
    """Whether this user takes the home's ``config.toml``. In a home a group shares (its store
    folder is setgid: ``harness/store/shared.py``) the folder is group-writable, so another
    member could write the file, naming caches and keys, archives, keyrings or interpreter
    lists of theirs: it is taken only when it (and what a link in its place points at) is
    this user's, root's or the home's owner's (the store folder's). Elsewhere: always."""
    import stat

    try:
        store = os.stat(path.parent / "store")
        owners = {os.lstat(path).st_uid, os.stat(path).st_uid}
    except OSError:
        return True  # not a shared home, or the reader names what is wrong
    if not store.st_mode & stat.S_ISGID or owners <= {0, os.geteuid(), store.st_uid}:
        return True
    if path not in _PASSED_BY:
        import pwd
        import sys

        _PASSED_BY.add(path)
        names = []
        for uid in sorted(owners - {0, os.geteuid(), store.st_uid}):
            try:
                names.append(pwd.getpwuid(uid).pw_name)
            except KeyError:
                names.append(str(uid))
        sys.stderr.write(
            f"warning: {path}: written by {', '.join(names)}, not by you or the home's owner; its settings "
            "are not used (in a shared home only the owner's config.toml is; yours: the environment's HARNESS_* "
            "variables, or the project's harness.toml)\n"
        )
    return False


class _LockTable(NamedTuple):
    """``[lock]`` of one settings file: its platforms (None: it sets none) with where they
    were set (``<file>: lock.platforms``), and its ``[lock.python]`` pins."""

    platforms: tuple[str, ...] | None
    origin: str
    pins: dict[str, str]


@dataclass
class _Merged:
    """Settings merged layer by layer, each later layer winning (:func:`load_settings`).

    ``cache``, ``python`` and ``gc`` hold :class:`Settings` keyword arguments: a key that no
    layer sets keeps the field's default.
    """

    indexes: dict[str, str] = field(default_factory=dict)
    hubs: dict[str, str] = field(default_factory=dict)
    lock_platforms: tuple[str, ...] = ()
    lock_platforms_origin: str = ""
    python_pins: dict[str, str] = field(default_factory=dict)
    git_mirrors: dict[str, str] = field(default_factory=dict)
    debian_archives: dict[str, str] = field(default_factory=dict)
    debian_keyrings: dict[str, Path] = field(default_factory=dict)
    debian_unsigned: set[str] = field(default_factory=set)
    cache: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)
    gc: dict[str, Any] = field(default_factory=dict)

    def add_file(self, path: Path) -> None:
        """Merge the settings file ``path``, its tables checked in reference order."""
        from harness.manifests.tomlfile import read_toml

        data = read_toml(path)
        self.indexes.update(_string_table(data, "indexes", path))
        self.hubs.update(_hubs_table(data, path))
        lock = _lock_table(data, path)
        if lock.platforms is not None:
            self.lock_platforms, self.lock_platforms_origin = lock.platforms, lock.origin
        self.python_pins.update(lock.pins)
        self.cache.update(_cache_table(data, path))
        self.python.update(_python_table(data, path))
        self.git_mirrors.update(_git_mirrors(data, path))
        self._add_archives(_debian_archives(data, path))
        self.gc.update(_gc_table(data, path))

    def _add_archives(self, archives: list[tuple[str, str | None, Path | None, bool | None]]) -> None:
        for name, url, keyring, unsigned in archives:
            if url is not None:
                self.debian_archives[name] = url
            if keyring is not None:
                self.debian_keyrings[name] = keyring
            if unsigned is not None:
                (self.debian_unsigned.add if unsigned else self.debian_unsigned.discard)(name)

    def add_environment(self) -> None:
        """Merge the environment's variables (module docstring), which win over every file."""
        self.indexes.update(_env_indexes())
        self._add_archives(_env_archives())
        self.hubs.update(_env_hubs())
        self.cache.update(_env_cache())
        self.python.update(_env_python(self.python))
        self.gc.update(_env_gc())

    def settings(self) -> Settings:
        """The merged settings."""
        return Settings(
            indexes=self.indexes,
            hubs=self.hubs,
            lock_platform=self.lock_platforms[0] if self.lock_platforms else None,
            lock_platforms=self.lock_platforms,
            lock_platforms_origin=self.lock_platforms_origin,
            python_pins=self.python_pins,
            git_mirrors=self.git_mirrors,
            debian_archives=self.debian_archives,
            debian_keyrings=self.debian_keyrings,
            debian_unsigned=tuple(sorted(self.debian_unsigned)),
            python_downloads_json_url=self.python.get("python_downloads_json_url"),
            python_install_mirror=self.python.get("python_install_mirror"),
            python_download_retry_minutes=self.python.get("python_download_retry_minutes", 60.0),
            **self.cache,
            **self.gc,
        )


def _hubs_table(data: dict[str, Any], path: Path) -> dict[str, str]:
    """``[hubs]`` of one settings file; a hub harness does not know is refused."""
    hubs = _string_table(data, "hubs", path)
    for hub in hubs:
        if hub not in HUBS:
            raise InputError(f"{path}: hubs.{hub}: unknown hub; known: {', '.join(HUBS)}")
    return hubs


def _lock_table(data: dict[str, Any], path: Path) -> _LockTable:
    """``[lock]`` of one settings file (empty when absent), refused unless its keys are
    ``platform`` or ``platforms`` (not both) and ``python``."""
    table = data.get("lock", {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: lock: expected a table")
    unknown = sorted(set(table) - {"platform", "platforms", "python"})
    if unknown:
        raise InputError(f"{path}: lock.{unknown[0]}: unknown key; valid keys: platform, platforms, python")
    if "platform" in table and "platforms" in table:
        raise InputError(
            f"{path}: lock: set platform or platforms, not both",
            hint='platforms = [...] lists every platform; platform = "..." is one',
        )
    platforms: tuple[str, ...] | None = None
    origin = ""
    if "platform" in table:
        if not isinstance(table["platform"], str):
            raise InputError(f'{path}: lock.platform: expected a string like "x86_64-manylinux_2_28"')
        platforms, origin = (table["platform"],), f"{path}: lock.platform"
    if "platforms" in table:
        platforms, origin = _lock_platforms(table["platforms"], path), f"{path}: lock.platforms"
    return _LockTable(platforms, origin, _python_pins(table, path))


def _lock_platforms(values: object, path: Path) -> tuple[str, ...]:
    """``[lock] platforms`` of one settings file: a non-empty list of strings, no repeats."""
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise InputError(f'{path}: lock.platforms: expected a non-empty list of strings like "x86_64-manylinux_2_28"')
    if len(set(values)) != len(values):
        raise InputError(f"{path}: lock.platforms: a platform is listed twice")
    return tuple(values)


def _python_pins(lock_table: dict[str, Any], path: Path) -> dict[str, str]:
    """``[lock.python]`` of one settings file: ``"3.X" = "3.X.Y"`` entries."""
    pins = lock_table.get("python", {})
    if not isinstance(pins, dict) or not all(
        isinstance(v, str) and re.match(r"^3\.\d+\.\d+$", v) and v.startswith(k + ".") for k, v in pins.items()
    ):
        raise InputError(f'{path}: lock.python: expected "3.X" = "3.X.Y" entries')
    return pins


def _env_indexes() -> dict[str, str]:
    """Index addresses from ``HARNESS_INDEX_<NAME>`` variables, by the names they stand for."""
    return {
        key.removeprefix("HARNESS_INDEX_").lower().replace("_", "-"): value
        for key, value in os.environ.items()
        if key.startswith("HARNESS_INDEX_") and value
    }


def _env_archives() -> list[tuple[str, str | None, Path | None, bool | None]]:
    """Debian archives from ``HARNESS_DEBIAN_ARCHIVE_<NAME>`` (address),
    ``HARNESS_DEBIAN_KEYRING_<NAME>`` (keyring) and ``HARNESS_DEBIAN_UNSIGNED_<NAME>`` variables."""
    out: list[tuple[str, str | None, Path | None, bool | None]] = []
    for key, value in sorted(os.environ.items()):
        if not value:
            continue
        for prefix in ("HARNESS_DEBIAN_ARCHIVE_", "HARNESS_DEBIAN_KEYRING_", "HARNESS_DEBIAN_UNSIGNED_"):
            if key.startswith(prefix) and key != prefix:
                name = key.removeprefix(prefix).lower().replace("_", "-")
                if prefix.endswith("ARCHIVE_"):
                    out.append((name, value, None, None))
                elif prefix.endswith("KEYRING_"):
                    out.append((name, None, Path(value).expanduser().absolute(), None))
                elif value.lower() in ("1", "true", "yes"):
                    out.append((name, None, None, True))
                else:
                    raise InputError(f"{key}={value!r}: expected 1 (lock from the archive without checking it)")
    return out


_ARCHIVE_KEYS = ("url", "keyring", "allow-unsigned")


def _debian_archives(data: dict[str, Any], path: Path) -> list[tuple[str, str | None, Path | None, bool | None]]:
    """``[debian-archives]`` of one settings file: ``name = "url"``, or a ``[debian-archives.name]``
    table of ``url``, ``keyring`` (a path relative to the file) and ``allow-unsigned``."""
    table = data.get("debian-archives", {})
    if not isinstance(table, dict):
        raise InputError(f'{path}: debian-archives: expected a table of name = "url" or [debian-archives.<name>]')
    out: list[tuple[str, str | None, Path | None, bool | None]] = []
    for name, value in table.items():
        where = f"{path}: debian-archives.{name}"
        if isinstance(value, str):
            value = {"url": value}
        if not isinstance(value, dict):
            raise InputError(f"{where}: expected an address or a table of {', '.join(_ARCHIVE_KEYS)}")
        unknown = sorted(set(value) - set(_ARCHIVE_KEYS))
        if unknown:
            raise InputError(f"{where}.{unknown[0]}: unknown key; valid keys: {', '.join(_ARCHIVE_KEYS)}")
        url = value.get("url")
        if url is not None and (not isinstance(url, str) or not re.match(r"^(https?|file)://\S+$", url)):
            raise InputError(f"{where}{'.url' if 'url' in value else ''}: expected an http(s):// or file:// address")
        keyring = value.get("keyring")
        if keyring is not None and (not isinstance(keyring, str) or not keyring or "://" in keyring):
            raise InputError(f"{where}.keyring: expected a path on this machine (a keyring is never fetched)")
        unsigned = value.get("allow-unsigned")
        if unsigned is not None and not isinstance(unsigned, bool):
            raise InputError(f"{where}.allow-unsigned: expected true or false")
        resolved = (path.parent / Path(keyring).expanduser()).absolute() if keyring else None
        out.append((name, url, resolved, unsigned))
    return out


def _env_hubs() -> dict[str, str]:
    """Hub endpoints from ``HF_ENDPOINT`` and ``HARNESS_MODELSCOPE_ENDPOINT``."""
    hubs: dict[str, str] = {}
    if os.environ.get("HF_ENDPOINT"):
        hubs["huggingface"] = os.environ["HF_ENDPOINT"]
    if os.environ.get("HARNESS_MODELSCOPE_ENDPOINT"):
        hubs["modelscope"] = os.environ["HARNESS_MODELSCOPE_ENDPOINT"]
    return hubs


def _env_cache() -> dict[str, Any]:
    """``[cache]`` keyword arguments from the environment (a list variable set even empty wins)."""
    cache: dict[str, Any] = {}
    if os.environ.get("HARNESS_SUBSTITUTERS") is not None:
        cache["substituters"] = tuple(os.environ["HARNESS_SUBSTITUTERS"].split())
    if os.environ.get("HARNESS_TRUSTED_KEYS") is not None:
        cache["trusted_keys"] = tuple(os.environ["HARNESS_TRUSTED_KEYS"].split())
    if os.environ.get("HARNESS_SECRET_KEY_FILE"):
        cache["secret_key_file"] = Path(os.environ["HARNESS_SECRET_KEY_FILE"]).expanduser()
    return cache


def _env_python(configured: dict[str, Any]) -> dict[str, Any]:
    """``[python]`` keyword arguments from the environment: harness's variables win over
    ``configured`` (the files'), uv's own count only where neither sets the field."""
    python: dict[str, Any] = {}
    retry = os.environ.get("HARNESS_PYTHON_DOWNLOAD_RETRY_MINUTES")
    if retry:
        python["python_download_retry_minutes"] = _retry_minutes(retry, "HARNESS_PYTHON_DOWNLOAD_RETRY_MINUTES")
    for field_name, variables in (
        ("python_downloads_json_url", ("HARNESS_PYTHON_DOWNLOADS_JSON_URL", "UV_PYTHON_DOWNLOADS_JSON_URL")),
        ("python_install_mirror", ("HARNESS_PYTHON_INSTALL_MIRROR", "UV_PYTHON_INSTALL_MIRROR")),
    ):
        harness_var, uv_var = variables
        if os.environ.get(harness_var):
            value = os.environ[harness_var]
            if field_name == "python_install_mirror" and not re.match(r"^(https?|file)://\S+$", value):
                raise InputError(f"{harness_var}: expected an http(s):// or file:// address, got {value!r}")
            python[field_name] = _python_location(value, harness_var, Path.cwd())
        elif os.environ.get(uv_var) and field_name not in configured:
            python[field_name] = os.environ[uv_var]
    return python


def _env_gc() -> dict[str, Any]:
    """``[gc]`` keyword arguments from the environment (``HARNESS_GC_KEEP_RUNS``,
    ``HARNESS_GC_KEEP_WHEEL_FILES``)."""
    out: dict[str, Any] = {}
    keep_files = os.environ.get("HARNESS_GC_KEEP_WHEEL_FILES")
    if keep_files:
        if keep_files not in ("0", "1"):
            raise InputError(f"HARNESS_GC_KEEP_WHEEL_FILES={keep_files!r}: expected 0 or 1")
        out["gc_keep_wheel_files"] = keep_files == "1"
    if not os.environ.get("HARNESS_GC_KEEP_RUNS"):
        return out
    value = os.environ["HARNESS_GC_KEEP_RUNS"]
    if not value.isdigit():
        raise InputError(f"HARNESS_GC_KEEP_RUNS={value!r}: expected a whole number of runs")
    return {**out, "gc_keep_runs": int(value)}


def _checked_table(data: dict[str, Any], path: Path, name: str, known: dict[str, str]) -> dict[str, Any]:
    """``[name]`` of one settings file (empty when absent), refused unless a table of ``known`` keys."""
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: {name}: expected a table")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(f"{path}: {name}.{unknown[0]}: unknown key; valid keys: {', '.join(known)}")
    return table


def _retry_minutes(value: object, where: str) -> float:
    """``download-retry-minutes`` (a number ≥ 0, from a file or a variable's text)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise InputError(f"{where}: expected a number of minutes (0 or more), got {value!r}")
    return float(value)


def _python_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``[python]`` of one settings file, as Settings keyword arguments."""
    known = {
        "downloads-json-url": "python_downloads_json_url",
        "install-mirror": "python_install_mirror",
        "download-retry-minutes": "python_download_retry_minutes",
    }
    table = _checked_table(data, path, "python", known)
    out: dict[str, Any] = {}
    for key, field_name in known.items():
        if key == "download-retry-minutes" and key in table:
            out[field_name] = _retry_minutes(table[key], f"{path}: python.{key}")
        elif key in table:
            value = table[key]
            if not isinstance(value, str) or not value:
                raise InputError(f"{path}: python.{key}: expected an address or a path")
            if key == "install-mirror" and not re.match(r"^(https?|file)://\S+$", value):
                raise InputError(f"{path}: python.install-mirror: expected an http(s):// or file:// address")
            out[field_name] = _python_location(value, f"{path}: python.{key}", path.parent)
    return out


def _python_location(value: str, where: str, base: Path) -> str:
    """A download list's or mirror's address as uv takes it: a URL as is, a path made absolute
    (relative to ``base``, the folder of the file that names it)."""
    if re.match(r"^(https?|file)://\S+$", value):
        return value
    if "://" in value:
        raise InputError(f"{where}: expected an http(s):// or file:// address or a path, got {value!r}")
    return str((base / Path(value).expanduser()).resolve())


_GIT_URL = re.compile(r"^((https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+|/\S*)$")


def _git_mirrors(data: dict[str, Any], path: Path) -> dict[str, str]:
    """``[git-mirrors]`` of one settings file: canonical URL (or prefix ending in ``/``) → mirror."""
    table = data.get("git-mirrors", {})
    if not isinstance(table, dict):
        raise InputError(f'{path}: git-mirrors: expected a table of "canonical URL" = "mirror URL"')
    for canonical, mirror in table.items():
        if not isinstance(mirror, str) or not _GIT_URL.match(mirror):
            raise InputError(
                f'{path}: git-mirrors."{canonical}": expected a git URL (file://, https://, '
                "ssh://, user@host:path) or an absolute path"
            )
        if canonical.endswith("/") != mirror.endswith("/"):
            raise InputError(
                f"{path}: git-mirrors.\"{canonical}\": a prefix (ending in '/') maps to a "
                "prefix, a repository to a repository"
            )
    return dict(table)


def _cache_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``[cache]`` of one settings file, as Settings keyword arguments."""
    table = data.get("cache", {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: cache: expected a table")
    known = {"substituters": "substituters", "trusted-keys": "trusted_keys", "secret-key-file": "secret_key_file"}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(f"{path}: cache.{unknown[0]}: unknown key; valid keys: {', '.join(known)}")
    out: dict[str, Any] = {}
    for key in ("substituters", "trusted-keys"):
        if key in table:
            values = table[key]
            if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
                raise InputError(f"{path}: cache.{key}: expected a list of strings")
            out[known[key]] = tuple(values)
    if "secret-key-file" in table:
        value = table["secret-key-file"]
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: cache.secret-key-file: expected a path")
        out["secret_key_file"] = (path.parent / Path(value).expanduser()).resolve()
    return out


def _gc_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``[gc]`` of one settings file, as Settings keyword arguments."""
    known = {
        "keep-runs": "gc_keep_runs",
        "missing-project-days": "gc_missing_project_days",
        "keep-wheel-files": "gc_keep_wheel_files",
    }
    table = _checked_table(data, path, "gc", known)
    out: dict[str, Any] = {}
    if "keep-wheel-files" in table:
        if not isinstance(table["keep-wheel-files"], bool):
            raise InputError(f"{path}: gc.keep-wheel-files: expected true or false")
        out["gc_keep_wheel_files"] = table["keep-wheel-files"]
    keep = table.get("keep-runs")
    if keep is not None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InputError(f"{path}: gc.keep-runs: expected a whole number of runs (0 or more)")
        out["gc_keep_runs"] = keep
    days = table.get("missing-project-days")
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, (int, float)) or days < 0:
            raise InputError(f"{path}: gc.missing-project-days: expected a number of days (0 or more)")
        out["gc_missing_project_days"] = float(days)
    return out


def _string_table(data: dict[str, Any], key: str, path: Path) -> dict[str, str]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise InputError(f'{path}: {key}: expected a table of name = "url"')
    for name, value in table.items():
        if not isinstance(value, str) or not re.match(r"^(https?|file)://\S+$", value):
            raise InputError(f"{path}: {key}.{name}: expected an http(s):// or file:// address")
    return dict(table)
