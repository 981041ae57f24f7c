"""Signing keys and the trust list on disk, and the Signer and Verifier a process builds
from its settings.

Each role's private key is a PEM file of its own (owner-only), so a process is given the
keys of the roles it signs as and no others. The trust list is a JSON or YAML file that
verifiers re-read whenever it changes. Where neither is configured, the first process
that signs makes a keypair per role and a trust list of them in the data folder: the
zero-config path is Ed25519 too.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path

import orjson
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from pydantic import ValidationError

from dsec.schemas.base import now_ms
from dsec.schemas.settings import DsecSettings
from dsec.schemas.signing import (
    Ed25519Signer,
    HmacSigner,
    HmacVerifier,
    Keyring,
    M,
    Signer,
    TrustListVerifier,
    Verifier,
    new_keyring,
)
from dsec.schemas.trust import KeyRole, TrustList

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
LOCAL_KEY_VALIDITY_DAYS = 365
TRUST_FILE = "trust.json"  # in the keys folder, unless DSEC_TRUST_LIST says elsewhere


class KeyFileError(RuntimeError):
    """A key or trust list file that is missing or unreadable; the message says which."""


def key_path(keys_dir: Path, role: KeyRole) -> Path:
    return keys_dir / f"{role}.pem"


def _write_atomically(path: Path, body: bytes, mode: int, replace: bool = True) -> None:
    """Written whole or not at all; with ``replace=False`` an existing file is an error."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # FileExistsError rather than overwrite a key
    finally:
        temporary.unlink(missing_ok=True)


def write_private_key(path: Path, key: Ed25519PrivateKey, *, replace: bool = False) -> None:
    body = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_atomically(path, body, 0o600, replace=replace)


def read_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise KeyFileError(f"no private key at {path} (dsec keys generate)") from None
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: a {type(key).__name__}, not an Ed25519 key")
    return key


def read_trust_list(path: Path) -> TrustList:
    try:
        document = yaml.safe_load(path.read_bytes())  # JSON is YAML
    except FileNotFoundError:
        raise KeyFileError(f"no trust list at {path}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise KeyFileError(f"{path}: unreadable trust list: {exc}") from None
    try:
        return TrustList.model_validate(document or {})
    except ValidationError as exc:
        raise KeyFileError(f"{path}: invalid trust list: {exc}") from None


def write_trust_list(path: Path, trust: TrustList) -> None:
    body = orjson.dumps(trust.model_dump(mode="json", exclude_none=True),
                        option=orjson.OPT_INDENT_2)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, body + b"\n", 0o644)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino


class TrustListFile:
    """The trust list in a file, re-read when the file changes: checked (one stat) at
    every call, so a key revoked in the file is refused from the next verification on.
    A file that disappears or fails to parse leaves the last list read in force (a
    ConfigMap update swaps a link; a half-written file is not a revocation of every key),
    and is logged; one never read trusts no key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._trust = TrustList()
        self.load_errors = 0

    def __call__(self) -> TrustList:
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self._stamp:
            try:
                self._trust = read_trust_list(self.path)
            except KeyFileError as exc:
                self.load_errors += 1
                log.warning("dsec: trust list kept as it was: %s", exc)
            self._stamp = stamp
        return self._trust


class KeyFileSigner(Signer):
    """One role's private key, read from its file and read again when the file is
    replaced: a rotated key signs from the next model on, without a restart. A
    replacement that cannot be read leaves the previous key signing, and is logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self._signer = Ed25519Signer(read_private_key(path))

    @property
    def key_id(self) -> str:
        self._refresh()
        return self._signer.key_id

    def _refresh(self) -> None:
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._signer = Ed25519Signer(read_private_key(self.path))
        except KeyFileError as exc:
            log.warning("dsec: signing key kept as it was: %s", exc)

    def sign(self, model: M) -> M:
        self._refresh()
        return self._signer.sign(model)


def make_keyring(keys_dir: Path, validity_days: int = LOCAL_KEY_VALIDITY_DAYS) -> bool:
    """A keypair per role in ``keys_dir`` and a trust list of them (``trust.json``), made
    at once: several processes starting together agree on one. False when ``keys_dir``
    exists already (nothing is made)."""
    if keys_dir.exists():
        return False
    _, trust, private = new_keyring(expires_at_ms=now_ms() + validity_days * DAY_MS)
    keys_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = keys_dir.with_name(f".{keys_dir.name}.{secrets.token_hex(4)}")
    staging.mkdir(mode=0o700)
    try:
        for role, key in private.items():
            write_private_key(key_path(staging, role), key)
        write_trust_list(staging / TRUST_FILE, trust)
        try:
            os.rename(staging, keys_dir)
        except OSError:  # another process made it first
            return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _local_keyring(settings: DsecSettings) -> None:
    """The zero-config path: with no trust list configured, the keys folder (by default
    in the data folder) is made by the first process that signs. Never by one that only
    verifies: a worker that made the keys its node's actuator then trusted could sign its
    own commands."""
    keys_dir = settings.keys_directory()
    if settings.trust_list is None and not keys_dir.exists():
        make_keyring(keys_dir)


def signer_for(settings: DsecSettings, role: KeyRole,
               also: Iterable[KeyRole] = ()) -> Signer:
    """What this process signs with: the key of ``role`` (required) and of the roles in
    ``also`` whose files it was given; in hmac-dev mode the shared key."""
    if settings.signing_mode == "hmac-dev":
        return HmacSigner(settings.signing_key_bytes())
    _local_keyring(settings)
    keys_dir = settings.keys_directory()
    signers: dict[KeyRole, Signer] = {role: KeyFileSigner(key_path(keys_dir, role))}
    for extra in also:
        if key_path(keys_dir, extra).exists():
            signers[extra] = KeyFileSigner(key_path(keys_dir, extra))
    return Keyring(signers)


def verifier_for(settings: DsecSettings) -> Verifier:
    """What this process verifies with: the trust list file (re-read when it changes, so
    one the engine makes after this process started is read then); in hmac-dev mode the
    shared key."""
    if settings.signing_mode == "hmac-dev":
        return HmacVerifier(settings.signing_key_bytes())
    path = settings.trust_list_path()
    if not path.exists():
        log.warning("dsec: no trust list at %s yet: every signature is refused until it "
                    "is there", path)
    return TrustListVerifier(TrustListFile(path))


def signing_env(settings: DsecSettings) -> dict[str, str]:
    """The environment that gives a child process the keys and trust list of
    ``settings`` (whatever data folder the child has)."""
    env = {"DSEC_SIGNING_MODE": settings.signing_mode}
    if settings.signing_mode == "hmac-dev":
        env["DSEC_SIGNING_KEY"] = settings.signing_key_bytes().decode()
        return env
    env["DSEC_KEYS_DIR"] = str(settings.keys_directory().resolve())
    if settings.trust_list is not None:
        env["DSEC_TRUST_LIST"] = str(settings.trust_list.resolve())
    return env
