"""The digest a lock records of the manifest it was made from (for ``lock --check``).

It covers only what shapes the lock — the manifest's ``[environment]`` and ``[[weights]]``,
validated with defaults filled in — not its bytes and not its runtime keys: reformatting, a
comment, or a change of ``load_seconds``, ``port``, ``command``, ``client``, ``vram_gb``,
``health``, ``scoped``, ``summary``… does not make a lock stale (placement and launch read
those from the manifest itself); any change of what is resolved and realized does.

Locks written before this scheme recorded the digest of the whole manifest
(``harness-manifest-v1``); :func:`accepted_digests` still accepts it, so an upgrade does not
make every lock stale.
"""

from __future__ import annotations

from pydantic import BaseModel

from harness.store.hashing import canonical_json

#: Bump when the lock format changes what a manifest's lock contains.
DIGEST_SCHEME = "harness-manifest-v2"
#: The previous scheme: the whole manifest.
LEGACY_SCHEME = "harness-manifest-v1"
#: The manifest keys a lock is made from; every other key is read at runtime.
LOCK_SHAPING_KEYS = ("environment", "weights")
#: Keys added to a lock-shaping table after this scheme, with the value that leaves them out
#: of the digest: a manifest that does not use them keeps the digest its lock recorded.
ADDED_LATER: dict[str, dict[str, object]] = {"environment": {"no-build-isolation": [], "variants": {}}}


def manifest_digest(manifest: BaseModel) -> str:
    """``blake3:<hex>`` of the canonical JSON of the keys that shape the lock."""
    import blake3

    dumped = _dumped(manifest)
    payload = canonical_json(
        {
            "scheme": DIGEST_SCHEME,
            "type": type(manifest).__name__,
            "manifest": {key: dumped.get(key) for key in LOCK_SHAPING_KEYS},
        }
    )
    return "blake3:" + blake3.blake3(payload).hexdigest()


def accepted_digests(manifest: BaseModel) -> frozenset[str]:
    """The digests a fresh lock of ``manifest`` may record: this scheme's and the legacy one."""
    import blake3

    legacy = canonical_json(
        {
            "scheme": LEGACY_SCHEME,
            "type": type(manifest).__name__,
            "manifest": _dumped(manifest),
        }
    )
    return frozenset({manifest_digest(manifest), "blake3:" + blake3.blake3(legacy).hexdigest()})


def _dumped(manifest: BaseModel) -> dict[str, object]:
    """The manifest as JSON data, without the :data:`ADDED_LATER` keys it leaves unused."""
    dumped = manifest.model_dump(mode="json", by_alias=True)
    for table, unused in ADDED_LATER.items():
        values = dumped.get(table)
        if isinstance(values, dict):
            for key, value in unused.items():
                if values.get(key) == value:
                    values.pop(key, None)
    return dumped
