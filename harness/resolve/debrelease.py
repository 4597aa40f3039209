"""A Debian archive's signed ``InRelease``: checked with ``gpgv``, then trusted for index hashes.

``harness lock`` reads ``dists/<suite>/InRelease`` of the archive a template names and checks
it as apt does, before any Packages index is read:

1. ``gpgv`` (package ``gpgv``, on every Debian) verifies the clear-signed file against the
   keyring the settings name for the archive (``[debian-archives.<name>] keyring``: a path on
   this machine, never fetched from the archive). At least one good signature by a key of the
   keyring, and no bad one; the text used afterwards is what ``gpgv`` says was signed (its
   ``--output``), never the bytes around the signature;
2. the signed Release must name the suite asked for (``Suite`` or ``Codename``: an old
   suite's signed file served for a newer one is refused) and, where it has ``Valid-Until``,
   must not have expired;
3. its ``SHA256`` list gives each index file's size and sha256: :func:`checked_index` refuses a
   Packages file whose bytes differ, naming the file, the expected and the actual sha256.

An archive whose settings say ``allow-unsigned = true`` is read without any of this; the lock
records which was done (``release``, and ``signed-by``: the primary fingerprints of the keys
whose signatures held). ``parse_release`` and ``signed_by`` are pure.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

from harness.errors import HarnessError, InputError
from harness.resolve.deb822 import parse_stanzas

_MAX_RELEASE = 64 * 1024 * 1024
VERIFIED = "InRelease verified with gpgv"
UNVERIFIED = "not verified (allow-unsigned)"


class ReleaseError(HarnessError):
    """An archive's InRelease or an index it lists cannot be trusted."""


@dataclass(frozen=True)
class Release:
    """What the signed Release says: each index file's sha256 and size, by its path under
    ``dists/<suite>/``, and who signed it."""

    where: str  # the InRelease's address, for errors
    files: dict[str, tuple[str, int]]
    signed_by: tuple[str, ...]


def parse_release(text: str) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
    """A Release file's fields and its ``SHA256`` list (path -> (sha256, size)) (pure)."""
    stanzas = parse_stanzas(text)
    fields = stanzas[0] if stanzas else {}  # one stanza
    files: dict[str, tuple[str, int]] = {}
    for line in fields.get("SHA256", "").splitlines():
        parts = line.split()
        if len(parts) == 3 and len(parts[0]) == 64 and parts[1].isdigit():
            files[parts[2]] = (parts[0].lower(), int(parts[1]))
    return fields, files


def signed_by(status: str) -> tuple[tuple[str, ...], list[str]]:
    """From ``gpgv --status-fd`` lines: the primary fingerprints of good signatures, sorted, and
    what went wrong with the others (pure)."""
    good: set[str] = set()
    problems = []
    for line in status.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] != "[GNUPG:]":
            continue
        kind = words[1]
        if kind == "VALIDSIG":
            good.add(words[-1].upper() if len(words) >= 12 else words[2].upper())
        elif kind == "BADSIG":
            problems.append(f"a BAD signature by key {words[2]}")
        elif kind == "NO_PUBKEY":
            problems.append(f"signed by key {words[2]}, which is not in the keyring")
        elif kind in ("EXPKEYSIG", "REVKEYSIG", "EXPSIG"):
            what = {"EXPKEYSIG": "an expired key", "REVKEYSIG": "a revoked key", "EXPSIG": "an expired signature"}
            problems.append(f"{what[kind]} {words[2]}")
    return tuple(sorted(good)), problems


def fetch_release(archive_url: str, suite: str, keyring: Path, *, now: datetime | None = None) -> Release:
    """The checked Release of ``suite`` (module doc, steps 1 and 2)."""
    where = f"{archive_url.rstrip('/')}/dists/{suite}/InRelease"
    if not keyring.is_file():
        raise InputError(
            f"the keyring {keyring} for {where} does not exist",
            hint="set [debian-archives.<name>] keyring to a keyring file on this machine "
            "(Debian's: apt-get install debian-archive-keyring)",
        )
    data = _get(where)
    text, status, code = _gpgv(data, keyring, where)
    good, problems = signed_by(status)
    if not good or any("BAD" in p for p in problems):
        found = "; ".join(problems) or (status.strip().splitlines() or [f"gpgv exit {code}"])[-1]
        raise ReleaseError(
            f"{where}: the signature does not verify against {keyring}: expected a signature by "
            f"{_keyring_keys(keyring)}, found: {found}",
            hint="check the archive's address and the keyring the settings name for it",
        )
    fields, files = parse_release(text)
    if suite not in (fields.get("Suite"), fields.get("Codename")):
        raise ReleaseError(
            f"{where}: the signed Release is for suite {fields.get('Suite')!r} "
            f"(codename {fields.get('Codename')!r}), not {suite!r}"
        )
    _check_valid_until(fields.get("Valid-Until"), where, now or datetime.now(UTC))
    return Release(where, files, good)


def checked_index(release: Release, path: str, data: bytes, shown: str) -> None:
    """Refuse ``data`` (the file ``path`` under ``dists/<suite>/``) unless the signed Release
    lists it with this size and sha256 (module doc, step 3)."""
    listed = release.files.get(path)
    if listed is None:
        raise ReleaseError(f"{shown}: not listed in the signed Release {release.where}")
    expected, size = listed
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected or len(data) != size:
        raise ReleaseError(
            f"{shown}: does not match the signed Release {release.where}: expected sha256 {expected} "
            f"({size} bytes), got sha256 {actual} ({len(data)} bytes)",
            hint="the archive or a mirror between changed the index: try again later, or another mirror",
        )


def _check_valid_until(value: str | None, where: str, now: datetime) -> None:
    if not value:
        return
    try:
        until = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        raise ReleaseError(f"{where}: Valid-Until {value!r} is not a date") from None
    if until.tzinfo is None:
        until = until.replace(tzinfo=UTC)
    if until < now:
        raise ReleaseError(f"{where}: the signed Release expired on {value} (Valid-Until)")


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data: bytes = response.read(_MAX_RELEASE + 1)
    except urllib.error.HTTPError as exc:
        raise HarnessError(
            f"cannot read {url}: HTTP {exc.code}", hint="the archive must serve a signed InRelease"
        ) from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read {url}: {exc}") from None
    if len(data) > _MAX_RELEASE:
        raise ReleaseError(f"{url}: larger than {_MAX_RELEASE >> 20} MiB")
    return data


def _gpgv(data: bytes, keyring: Path, where: str) -> tuple[str, str, int]:
    """``gpgv``'s verdict on the clear-signed ``data``: (the signed text, the status lines, exit)."""
    gpgv = shutil.which("gpgv")
    if gpgv is None:
        raise HarnessError(
            f"cannot check {where}: gpgv is not installed",
            hint="apt-get install gpgv (or set allow-unsigned = true for the archive to lock unchecked)",
        )
    with tempfile.TemporaryDirectory(prefix="harness-gpgv-") as scratch:
        signed = Path(scratch) / "InRelease"
        signed.write_bytes(data)
        out = Path(scratch) / "Release"
        home = Path(scratch) / "home"
        home.mkdir(mode=0o700)
        result = subprocess.run(
            [gpgv, "--homedir", str(home), "--status-fd", "1", "--keyring", str(keyring)]
            + ["--output", str(out), str(signed)],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        text = out.read_text(encoding="utf-8", errors="replace") if out.is_file() else ""
    return text, result.stdout, result.returncode


def _keyring_keys(keyring: Path) -> str:
    """The keys of ``keyring`` as fingerprints where ``gpg`` can list them, else its path."""
    gpg = shutil.which("gpg")
    if gpg is None:
        return f"a key of {keyring}"
    with tempfile.TemporaryDirectory(prefix="harness-gpg-") as scratch:
        try:
            result = subprocess.run(
                [gpg, "--homedir", scratch, "--batch", "--with-colons", "--show-keys", str(keyring)],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return f"a key of {keyring}"
    fingerprints, primary = [], False
    for line in result.stdout.splitlines():
        fields = line.split(":")
        if fields[0] in ("pub", "sub"):
            primary = fields[0] == "pub"
        elif fields[0] == "fpr" and primary and len(fields) > 9:
            fingerprints.append(fields[9])
            primary = False
    return "one of " + ", ".join(fingerprints) if fingerprints else f"a key of {keyring}"
