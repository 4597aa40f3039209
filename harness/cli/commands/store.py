"""``harness store …``: inspect and maintain the content-addressed store."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from harness.cli import State
from harness.cli.output import quiet_option, variant_option

if TYPE_CHECKING:
    from harness.cache.backends import Backend
    from harness.cache.signing import SecretKey
    from harness.cache.transfer import PushResult
    from harness.lock.document import Lock
    from harness.manifests.project import Project
    from harness.store.store import Store


@click.group(
    help="Inspect and maintain the store: init, ls, path, verify, gc, why, pin; "
    "binary caches: keygen, push, pull, export, import.\n\n\b\nExamples:\n  harness store ls\n  harness store verify\n  harness store gc --dry-run"
)
def command() -> None:
    pass


#: ``--key``: what the commands that write a cache (``push``, ``export``) sign with.
_signing_key_option = click.option(
    "--key", metavar="FILE", help="Secret key to sign with [default: [cache] secret-key-file]."
)
#: ``--trusted-key``: what the commands that read a cache (``pull``, ``import``) trust
#: besides the configuration's keys; repeatable.
_trusted_key_option = click.option(
    "--trusted-key",
    "trusted_keys",
    multiple=True,
    metavar="NAME:BASE64",
    help="Also trust this public key (besides trusted-keys in configuration).",
)


def _store(state: State) -> Store:
    from harness.store.store import Store

    return Store.in_home(state.home)


@command.command(
    "init",
    help="Set up a home a group shares: setgid, group-writable, sticky store.\n\n\b\nExamples:\n  harness --home /srv/harness store init --group robotics",
)
@click.option("--group", required=True, metavar="GROUP", help="The group whose members share the home.")
@click.pass_obj
def init(state: State, group: str) -> None:
    from harness.store.shared import init_shared

    init_shared(state.home, group)
    click.echo(
        f"{state.home} is shared by group {group}: members use it with `--home {state.home}` "
        "or HARNESS_HOME; each can delete only the paths they registered"
    )


@command.command(
    "trust",
    help="In a shared home: list, add or remove the members whose paths everyone uses.\n\n\b\nExamples:\n  harness store trust                # list\n  harness store trust alice\n  harness store trust alice --remove",
)
@click.argument("members", nargs=-1)
@click.option("--remove", is_flag=True, help="Stop trusting MEMBERS instead.")
@click.pass_obj
def trust(state: State, members: tuple[str, ...], remove: bool) -> None:
    import pwd

    from harness.errors import HarnessError, InputError
    from harness.store.shared import is_shared
    from harness.store.store import user_name
    from harness.store.trust import read_members, write_members

    store = _store(state)
    if not is_shared(state.home):
        raise InputError(
            f"{state.home} is not a shared home: only its owner writes its store",
            hint="`harness store init --group GROUP` shares it",
        )
    listed = read_members(store.root)
    if not members:
        owner = user_name(store.root.stat().st_uid)
        click.echo(f"{owner} (the store's owner)")
        for member in listed:
            click.echo(member)
        return
    for member in members:
        try:
            pwd.getpwnam(member)
        except KeyError:
            raise InputError(f"store trust: no user {member!r} on this machine") from None
    if store.root.stat().st_uid != os.geteuid():
        raise HarnessError(
            f"only the store's owner ({user_name(store.root.stat().st_uid)}) can change whom its members trust",
            hint="ask them to run `harness store trust " + " ".join(members) + "`",
        )
    chosen = set(listed) - set(members) if remove else set(listed) | set(members)
    write_members(store.root, sorted(chosen))
    click.echo("trusted by every member: " + (", ".join(sorted(chosen)) or "(only the store's owner)"))


@command.command(
    "ls",
    help="List registered store paths: path, kind, size (and who registered it).\n\n"
    "\b\nExamples:\n  harness store ls\n  harness store ls --closure kinematics   # what a manifest's "
    "realized closure holds, and its total",
)
@click.option(
    "--closure",
    "closure_of",
    metavar="NAME",
    help="Only the closure of NAME (a manifest with a lock, or a store path), with its total size.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def ls(state: State, as_json: bool, closure_of: str | None) -> None:
    from harness.cli.output import print_json, print_table
    from harness.store.store import user_name

    store = _store(state)
    records = list(store.records(any_member=True))  # every member's, each with its owner
    for message in store.bad_entries:
        click.echo(f"warning: {message}", err=True)
    if closure_of is not None:
        wanted = _closure_names(state, store, closure_of)
        records = [r for r in records if r.name in wanted]
        total = sum(r.nar_size for r in records)
        summary = (
            f"closure of {closure_of}: {len(records)} path(s), {_size(total)} "
            "(each path's own size; files shared through the store's pool count in each)"
        )
        if as_json:
            print_json({"closure": closure_of, "paths": [r.name for r in records], "total": total})
            return
        print_table(None, ["path", "kind", "size"], [[r.name, r.kind, _size(r.nar_size)] for r in records])
        click.echo(summary)
        return
    owners = {r.name: store.owner(r.name) for r in records}
    names = {uid: user_name(uid) for uid in set(owners.values()) if uid is not None}
    if as_json:
        print_json(
            [
                {
                    **r.as_json(),
                    "path": str(store.root / r.name),
                    "size": r.nar_size,
                    "owner": _owner_name(names, owners[r.name]),
                    "trusted": store.untrusted_owner(r.name) is None,
                }
                for r in records
            ]
        )
        return
    from harness.store.shared import is_shared

    if not is_shared(state.home):  # a private home: every path is the caller's
        print_table(
            None, ["path", "kind", "size", "impure"], [[r.name, r.kind, _size(r.nar_size), r.impure] for r in records]
        )
        return
    print_table(
        None,
        ["path", "kind", "size", "impure", "owner"],
        [
            [
                r.name,
                r.kind,
                _size(r.nar_size),
                r.impure,
                f"{_owner_name(names, owners[r.name])}"
                + ("" if store.untrusted_owner(r.name) is None else " (not trusted: not used)"),
            ]
            for r in records
        ],
    )


def _closure_names(state: State, store: Store, name: str) -> set[str]:
    """What ``name`` needs here: a manifest's realized lock (every path it names, and what
    they reference), or a store path and what it references. InputError for neither."""
    from harness.errors import InputError
    from harness.store.gc import closure_of

    name = name.rstrip("/").rsplit("/", 1)[-1]
    if store.record(name, even_if_gone=True, any_member=True) is not None:
        return closure_of(store, [name])
    project = _project_or_none(state)
    if project is not None:
        from harness.lock.lockfile import lock_path, read
        from harness.lock.objects import lock_objects
        from harness.realize.standin import realized_lock

        lock_file = lock_path(project.locks_dir, name)
        if lock_file.is_file():
            return closure_of(store, lock_objects(realized_lock(store, read(lock_file))))
    raise InputError(
        f"{name} is neither a registered store path nor a locked manifest",
        hint="`harness store ls` lists the paths, `harness services` the manifests",
    )


def _owner_name(names: dict[int, str], uid: int | None) -> str | None:
    """The user name of ``uid`` (None: unknown owner or no such user)."""
    return names.get(uid) if uid is not None else None


def _size(n: int) -> str:
    if not 0 <= n < 1 << 70:  # a record another member wrote by hand: say it as it is
        return f"{n} B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@command.command(
    "path",
    help="Print the realized environment's path of a manifest.\n\n\b\nExamples:\n  harness store path kinematics\n  harness store path smolvla --weights",
)
@click.argument("name")
@click.option("--weights", is_flag=True, help="Print the weights view instead.")
@click.pass_obj
def path(state: State, name: str, weights: bool) -> None:
    from harness.errors import HarnessError
    from harness.lock.lockfile import lock_path, read
    from harness.lock.storepaths import weights_view_path

    project = state.project()
    lock_file = lock_path(project.locks_dir, name)
    if not lock_file.is_file():
        raise HarnessError(f"no lock for {name!r}", hint=f"run `harness lock {name}`")
    from harness.realize.standin import realized_lock

    store = _store(state)
    lock = realized_lock(store, read(lock_file))  # a host interpreter may stand in here
    target = weights_view_path(lock) if weights else lock.environment.store
    if target is None:
        raise HarnessError(f"{name} has no weights")
    if not store.is_registered(target):
        raise HarnessError(f"{name} is not realized ({target})", hint=f"run `harness realize {name}`")
    click.echo(str(store.root / target))


@command.command(
    "verify",
    help="Check registered paths; exit 1 naming every one that changed.\n\n\b\nExamples:\n  harness store verify\n  harness store verify kinematics --check-contents\n  harness store verify --repair",
)
@click.argument("names", nargs=-1)
@click.option("--check-contents", is_flag=True, help="Re-hash every byte.")
@click.option("--repair", is_flag=True, help="Re-fetch or rebuild what is modified or missing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def verify(state: State, names: tuple[str, ...], check_contents: bool, repair: bool, as_json: bool) -> None:
    from harness.store.verify import NOT_FAULTS, report, verify_store

    store = _store(state)
    findings = verify_store(store, check_contents=check_contents or repair, names=list(names) or None)
    bad = [f for f in findings if f.status not in NOT_FAULTS]
    repaired: list[str] = []
    if repair and bad:
        from harness.realize.repair import repair_paths

        repaired = repair_paths(store, state.project(), state.home, state.deploy_path, [f.name for f in bad])
    text, status = report(findings, repaired, as_json=as_json)
    if text:
        click.echo(text)
    if status:
        raise SystemExit(status)


def _gc_options(state: State) -> dict[str, Any]:
    """Where runs are and how many to keep, from the settings (``[gc]``)."""
    from harness.config import load_settings

    project = _project_or_none(state)
    settings = load_settings(state.home, project.root if project else None)
    from harness.realize.project_code import checkout_code_paths

    return {
        "runs_dir": state.home / "runs",
        "keep_runs": settings.gc_keep_runs,
        "grace_days": settings.gc_missing_project_days,
        "checkout_code": checkout_code_paths,
        "keep_wheel_files": settings.gc_keep_wheel_files,
    }


@command.command(
    "gc",
    help="Delete paths no root reaches (projects, pins, the last runs, pinned runs, "
    "live processes and `up`'s services).\n\n\b\nExamples:\n  harness store gc --dry-run\n  harness store gc",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted, and why.")
@click.option("--forget-missing", is_flag=True, help="Stop keeping what registered projects whose folder is gone used.")
@click.pass_obj
def gc(state: State, dry_run: bool, forget_missing: bool) -> None:
    import time

    from harness.store.gc import collect

    from harness.store.shared import is_shared

    options = _gc_options(state)
    result = collect(_store(state), dry_run=dry_run, forget_missing=forget_missing, **options)
    for project in result.missing_projects:
        since = time.strftime("%Y-%m-%d", time.localtime(project.since))
        if project.forgotten:
            verb = "would forget" if dry_run else "forgot"
            click.echo(
                f"{verb} project {project.root} (missing since {since}): its {project.paths} path(s) are no longer kept"
            )
        else:
            grace = options["grace_days"]
            until = (
                f"until `harness store gc --forget-missing` or {grace:g} days after {since}"
                if grace > 0
                else "until `harness store gc --forget-missing`"
            )
            click.echo(
                f"project {project.root} is missing (since {since}): keeping its {project.paths} path(s) {until}"
            )
    verb = "would delete" if dry_run else "deleted"
    for name, reason in result.dead:
        click.echo(f"{verb} {name}: {reason}")
    mine = " of those you registered (a shared home)" if is_shared(state.home) else ""
    click.echo(f"{verb} {len(result.dead)} path(s){mine}; {result.kept} kept")


@command.command(
    "why",
    help='Say what keeps a store path alive: references and every root naming it.\n\n\b\nExamples:\n  harness store why "$(harness store path kinematics)"',
)
@click.argument("name")
@click.pass_obj
def why(state: State, name: str) -> None:
    from harness.store.gc import why as reasons

    from harness.errors import InputError

    options = _gc_options(state)
    name = name.rstrip("/").rsplit("/", 1)[-1]
    store = _store(state)
    if store.record(name, even_if_gone=True, any_member=True) is None:
        # Not a path of this store at all (a manifest's name, a typo): gc has nothing to delete.
        raise InputError(
            f"{name} is not a registered store path in {store.root}",
            hint="`harness store ls` lists them (a name is HASH-NAME, e.g. what `harness store path NAME` prints)",
        )
    found = reasons(store, name, **options)
    for reason in found:
        click.echo(reason)
    if not found:
        click.echo(f"nothing refers to {name}: the next gc deletes it")


@command.command(
    "pin",
    help='Keep a store path alive across gc.\n\n\b\nExamples:\n  harness store pin "$(harness store path kinematics)"\n  harness store pin "$(harness store path kinematics)" --remove',
)
@click.argument("name")
@click.option("--remove", is_flag=True, help="Unpin instead.")
@click.pass_obj
def pin_command(state: State, name: str, remove: bool) -> None:
    from harness.errors import HarnessError
    from harness.store.gc import pin, unpin

    store = _store(state)
    name = name.rstrip("/").rsplit("/", 1)[-1]
    if remove:
        unpin(store, name)
        return
    if not store.is_registered(name):
        raise HarnessError(f"{name} is not a registered store path")
    pin(store, name)


# -- binary caches (harness/cache) ------------------------------------------------------


def _project_or_none(state: State) -> Project | None:
    from harness.errors import ProjectNotFound

    try:
        return state.project()
    except ProjectNotFound:
        return None


def _project_locks(state: State, names: tuple[str, ...] = ()) -> dict:
    """The project's locks by manifest name ({} outside a project); those of ``names`` alone
    when any of them names a lock, so ``--variant cu128 store push CACHE vb`` reads vb's lock
    only (another lock of the project need not have cu128)."""
    from harness.lock.lockfile import read

    project = _project_or_none(state)
    if project is None or not project.locks_dir.is_dir():
        return {}
    named = [project.locks_dir / f"{name}.lock.toml" for name in names if not _is_store_name(name.rstrip("/"))]
    paths = [p for p in named if p.is_file()] if any(p.is_file() for p in named) else None
    locks = {}
    for path in paths if paths is not None else sorted(project.locks_dir.glob("*.lock.toml")):
        lock = read(path)
        locks[lock.name] = lock
    return locks


def _is_store_name(text: str) -> bool:
    import re

    return re.match(r"^[0-9a-df-np-sv-z]{32}-", text) is not None


def _cache_names(state: State, names: tuple[str, ...]) -> list[str]:
    """Store path names from arguments: a store path (or its name) stands for itself, a
    manifest name for the paths its lock realizes; no arguments: every lock of the project."""
    from harness.errors import HarnessError
    from harness.lock.objects import build_inputs, lock_objects
    from harness.realize.standin import realized_lock

    store = _store(state)

    def _lock_paths(lock: Lock) -> list[str]:
        # The runtime closure, and the files it was built from where this store holds them
        # (a pushed cache then also serves another environment's build; a pull needs none).
        return [*lock_objects(lock), *(n for n in build_inputs(lock) if store.is_registered(n))]

    # What this store realized each lock to (a host interpreter may stand in, under its own name).
    locks = {name: realized_lock(store, lock) for name, lock in _project_locks(state, names).items()}
    if not names:
        if not locks:
            raise HarnessError(
                "no names given and no locks in a project here", hint="name manifests or store paths, or use --all"
            )
        return [n for lock in locks.values() for n in _lock_paths(lock)]
    out: list[str] = []
    for name in names:
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if _is_store_name(base):
            out.append(base)
        elif name in locks:
            out.extend(_lock_paths(locks[name]))
        else:
            raise HarnessError(
                f"{name!r} is neither a store path nor a locked manifest",
                hint=f"run `harness lock {name}`" if locks else None,
            )
    return list(dict.fromkeys(out))


def _secret(state: State, key: str | None) -> SecretKey | None:
    from pathlib import Path

    from harness.cache.signing import load_secret
    from harness.config import load_settings

    if key:
        return load_secret(Path(key).expanduser())
    project = _project_or_none(state)
    settings = load_settings(state.home, project.root if project else None)
    return load_secret(settings.secret_key_file) if settings.secret_key_file else None


def _trusted(state: State, extra: tuple[str, ...]) -> list[str]:
    """trusted-keys from settings, the deploy (when one is given) and the command line."""
    from harness.config import load_settings

    project = _project_or_none(state)
    keys = list(load_settings(state.home, project.root if project else None).trusted_keys)
    if project is not None and state.deploy_path is not None:
        keys += project.load_deploy(state.deploy_path).trusted_keys
    return list(dict.fromkeys([*keys, *extra]))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _do_push(
    state: State,
    backend: Backend,
    names: tuple[str, ...],
    all_paths: bool,
    key: str | None,
    jobs: int,
    quiet: bool = False,
) -> PushResult:
    from harness.cache.transfer import push

    store = _store(state)
    selected = [r.name for r in store.records()] if all_paths else _cache_names(state, names)
    secret = _secret(state, key)
    if secret is None:
        click.echo(
            "warning: no signing key (--key or [cache] secret-key-file): built paths will be refused by every puller",
            err=True,
        )
    return push(
        store, selected, backend, secret=secret, cache_dir=state.home / "cache", jobs=jobs, show_progress=not quiet
    )


@command.command(
    "keygen",
    help="Make an ed25519 signing key pair: NAME.secret and NAME.public.\n\n\b\nExamples:\n  harness store keygen lab --dir ~/.config/harness",
)
@click.argument("name")
@click.option("--dir", "folder", default=".", show_default=True, help="Where to write the two files.")
def keygen(name: str, folder: str) -> None:
    from pathlib import Path

    from harness.cache.signing import write_key_pair

    secret, public = write_key_pair(name, Path(folder).expanduser())
    click.echo(f"secret key: {secret} (keep it private; [cache] secret-key-file)")
    click.echo(f"public key: {public} (add its line to trusted-keys)")
    click.echo(public.read_text().strip())


@command.command(
    "push",
    help="Copy closures to a binary cache (directory, s3://, file://); only what it lacks.\n\n\b\nExamples:\n  harness store push --key ~/.config/harness/lab.secret /nfs/harness-cache kinematics\n  harness store push file:///nfs/harness-cache --all\n  harness store push --variant cu128 /nfs/harness-cache robodojo",
)
@click.argument("cache")
@click.argument("names", nargs=-1)
@click.option("--all", "all_paths", is_flag=True, help="Every registered path.")
@_signing_key_option
@click.option("--jobs", "-j", default=8, show_default=True, help="Parallel transfers.")
@variant_option
@quiet_option
@click.pass_obj
def push_command(
    state: State, cache: str, names: tuple[str, ...], all_paths: bool, key: str | None, jobs: int, quiet: bool
) -> None:
    from harness.cache.backends import open_backend

    result = _do_push(state, open_backend(cache, jobs=jobs), names, all_paths, key, jobs, quiet)
    click.echo(
        f"pushed {len(result.pushed)} path(s) ({_mib(result.uploaded_bytes)} uploaded), "
        f"{len(result.present)} already in {cache}"
    )


@command.command(
    "pull",
    help="Copy closures from a binary cache into the store; only what it lacks.\n\n\b\nExamples:\n  harness store pull /nfs/harness-cache kinematics\n  harness store pull file:///nfs/harness-cache --all",
)
@click.argument("cache")
@click.argument("names", nargs=-1)
@click.option("--all", "all_paths", is_flag=True, help="Every path the cache holds.")
@_trusted_key_option
@click.option("--jobs", "-j", default=8, show_default=True, help="Parallel transfers.")
@variant_option
@quiet_option
@click.pass_obj
def pull_command(
    state: State,
    cache: str,
    names: tuple[str, ...],
    all_paths: bool,
    trusted_keys: tuple[str, ...],
    jobs: int,
    quiet: bool,
) -> None:
    _do_pull(state, cache, None, names, all_paths, trusted_keys, jobs, quiet)


def _do_pull(
    state: State,
    cache: str,
    backend: Backend | None,
    names: tuple[str, ...],
    all_paths: bool,
    trusted_keys: tuple[str, ...],
    jobs: int,
    quiet: bool = False,
) -> None:
    from harness.cache.format import CacheError
    from harness.cache.signing import parse_trusted
    from harness.cache.substitute import expected_from_locks
    from harness.cache.transfer import open_substituters, pull

    trusted = parse_trusted(_trusted(state, trusted_keys))
    subs, problems = open_substituters([cache], jobs=jobs, backends={cache: backend} if backend else None)
    if not subs:
        raise CacheError(problems.get(cache) or f"cannot use cache {cache}")
    if all_paths:
        selected = sorted(_all_in_cache(subs[0].backend, _store(state)))
    else:
        selected = _cache_names(state, names)
    store = _store(state)
    result = pull(
        store,
        selected,
        subs,
        trusted=trusted,
        expected=expected_from_locks(_project_locks(state, () if all_paths else names).values()),
        cache_dir=state.home / "cache",
        jobs=jobs,
        show_progress=not quiet,
    )
    for line in result.warnings:
        click.echo(f"warning: {line}", err=True)
    for name, why in sorted(result.failed.items()):
        verb = "missing" if why == "no substituter has it" else "refused"
        click.echo(f"{verb} {name}: {why}", err=True)
    click.echo(
        f"pulled {len(result.registered)} path(s) ({_mib(result.downloaded_bytes)} downloaded), "
        f"{len(result.present)} already present, {len(result.failed)} refused or missing"
    )
    if result.failed:
        raise SystemExit(1)


def _all_in_cache(backend: Backend, store: Store) -> list[str]:
    """Every store path a cache describes (its narinfos' StorePath lines)."""
    from harness.cache.format import NarInfo

    names = []
    for key in backend.list():
        if key.endswith(".narinfo"):
            text = backend.read_bytes(key)
            if text is not None:
                names.append(NarInfo.parse(text.decode("utf-8", "replace"), f"{backend.url}/{key}").store_path)
    return names


@command.command(
    "export",
    help="Write closures as one tar (a directory cache) for air-gapped transfer.\n\n\b\nExamples:\n  harness store export kinematics reach -o closures.tar",
)
@click.argument("names", nargs=-1)
@click.option("-o", "--output", required=True, metavar="FILE", help="The tar to write.")
@click.option("--all", "all_paths", is_flag=True, help="Every registered path.")
@_signing_key_option
@click.option("--jobs", "-j", default=8, show_default=True, help="Parallel compression.")
@quiet_option
@click.pass_obj
def export_command(
    state: State, names: tuple[str, ...], output: str, all_paths: bool, key: str | None, jobs: int, quiet: bool
) -> None:
    from pathlib import Path

    from harness.cache.tarball import TarWriter

    writer = TarWriter(Path(output).expanduser())
    ok = False
    try:
        result = _do_push(state, writer, names, all_paths, key, jobs, quiet)
        ok = True
    finally:
        writer.close(keep=ok)
    click.echo(f"exported {len(result.pushed)} path(s) to {output}")


@command.command(
    "import",
    help="Register the paths of a tar written by `harness store export`.\n\n\b\nExamples:\n  harness store import closures.tar",
)
@click.argument("file")
@_trusted_key_option
@click.option("--jobs", "-j", default=8, show_default=True, help="Parallel unpacking.")
@quiet_option
@click.pass_obj
def import_command(state: State, file: str, trusted_keys: tuple[str, ...], jobs: int, quiet: bool) -> None:
    from pathlib import Path

    from harness.cache.tarball import TarReader

    reader = TarReader(Path(file).expanduser())
    _do_pull(state, reader.url, reader, (), True, trusted_keys, jobs, quiet)
