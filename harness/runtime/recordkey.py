"""The key a user's run records hash secret values with (``launch.recorded_environment``).

A run record names every variable a service saw, a secret-like one's value as a hash only,
so ``diff`` can say a token changed without writing it. An unkeyed hash of a weak secret
can be reversed by guessing, and records travel (attached to a report, copied for an
audit); so the hash is an HMAC under a key of the user's own: 32 random bytes in
``$XDG_CONFIG_HOME/harness/record.key`` (``~/.config``), made on first use, 0600, never in a
home a group shares and never sent anywhere. Two records made under one key compare; a
record from another user or machine says it cannot be compared, never "changed".

Where the key cannot be kept (a read-only home), each process uses a key of its own: its
records still hide every secret, and ``diff`` says they cannot be compared.
"""

from __future__ import annotations

import functools
import os
import secrets
from pathlib import Path

_KEY_BYTES = 32


def key_path() -> Path:
    """Where the user's record key lives."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "harness" / "record.key"


@functools.lru_cache(maxsize=4)
def _key_at(path: Path) -> bytes:
    from harness.store.entries import read_own

    for _ in range(2):
        data = read_own(path, limit=1024)
        if data is not None and len(data.strip()) == 2 * _KEY_BYTES:
            try:
                return bytes.fromhex(data.strip().decode("ascii"))
            except ValueError:
                pass
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue  # another process made it first (or a bad file is there: a key of our own below)
        except OSError:
            break
        key = secrets.token_bytes(_KEY_BYTES)
        try:
            os.write(fd, key.hex().encode("ascii") + b"\n")
        finally:
            os.close(fd)
        return key
    return secrets.token_bytes(_KEY_BYTES)


def record_key() -> bytes:
    """This user's record key (module doc), made on first use."""
    return _key_at(key_path())
