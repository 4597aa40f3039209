"""The substituter API that ``harness realize`` calls before building or downloading upstream.

:func:`substitute` registers whatever the configured caches can provide of the named paths
(and their references), and returns the names it registered; everything else is left for
realize to build locally. :func:`expected_from_locks` turns locks into the expectations that
let fixed-output paths (wheels, sources, weight sets) be trusted by the lock's hashes,
without a signature.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from harness.cache.signing import parse_trusted
from harness.cache.transfer import ExpectedContent, open_substituters, pull
from harness.store.store import Store

log = logging.getLogger("harness.cache")


def substitute(
    store: Store,
    names: list[str],
    *,
    substituters: list[str],
    trusted_keys: list[str],
    expected: Mapping[str, ExpectedContent],
    cache_dir: Path,
    jobs: int = 8,
    show_progress: bool = False,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """Register what ``substituters`` hold of ``names``' closures; return the names registered.

    The result is in dependency order (references first) and includes references pulled on
    the way. Paths already registered are neither fetched nor returned. A path that no cache
    has, that is untrusted (a built path without a signature by one of ``trusted_keys``), or
    that fails a check (archive hash, content hash, a lock's file hash, unsafe archive
    entries, a missing reference, a cache that vanished mid-transfer) is skipped, and one
    line saying why goes to ``warn`` (default: the ``harness.cache`` logger at WARNING), so
    realize builds it locally. An unreachable cache is skipped the same way.

    Raises only for configuration errors (:class:`~harness.cache.format.CacheConfigError`):
    a substituter URL with an unknown scheme or option, a malformed trusted key.
    ``cache_dir`` (``$HARNESS_HOME/cache``) keeps partial downloads for resumption.
    """
    report = warn or (lambda line: log.warning("%s", line))
    trusted = parse_trusted(trusted_keys)  # config errors first, before any network
    wanted = [n for n in dict.fromkeys(names) if not store.is_registered(n)]
    if not wanted or not substituters:
        return []
    subs, problems = open_substituters(substituters, jobs=jobs)
    for url, problem in problems.items():
        report(f"substituter {url} skipped: {problem}")
    if not subs:
        return []
    result = pull(
        store,
        wanted,
        subs,
        trusted=trusted,
        expected=expected,
        cache_dir=cache_dir,
        jobs=jobs,
        show_progress=show_progress,
    )
    for line in result.warnings:
        report(line)
    for name, why in sorted(result.failed.items()):
        if why == "no substituter has it":
            continue  # the normal case for a path nobody pushed: realize builds it, quietly
        report(f"not substituted: {name}: {why}")
    return result.registered


def expected_from_locks(locks: Iterable[object]) -> dict[str, ExpectedContent]:
    """What each lock's fixed-output paths must hold, by store path name.

    * the wheel or sdist realize installs: a folder holding the file under its own name,
      with the lock's sha256;
    * a source tree: the lock's tree hash as its content hash;
    * a weight set: exactly its files, each with the lock's sha256.

    Interpreters, environments and weights views are built, so they are absent here and
    need a signature.
    """
    from harness.lock.document import Lock
    from harness.lock.objects import chosen_file

    expected: dict[str, ExpectedContent] = {}
    for lock in locks:
        assert isinstance(lock, Lock)
        for package in [*lock.packages, *lock.build_packages]:
            file = chosen_file(package, lock)
            expected[file.store] = ExpectedContent("file", files={file.file: file.sha256})
        for source in lock.sources:
            expected[source.store] = ExpectedContent("source", content=source.tree)
        for weights in lock.weights:
            expected[weights.store] = ExpectedContent(
                "weights", files={item.path: item.sha256 for item in weights.files}
            )
    return expected


__all__ = ["ExpectedContent", "expected_from_locks", "substitute"]
