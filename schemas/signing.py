"""Signatures on what changes a worker or the policies the engine runs: actuation
commands, policies and policy deletions, each signed over the canonical JSON of the model
without its ``signature`` field.

Ed25519 is the scheme: each role signs with a private key only its holder has, and a
verifier holds public keys only, in a trust list (``schemas/trust.py``) that says which
role each key has. A signature names its key: ``ed25519:<key id>:<base64 signature>``.

HMAC-SHA256 with one shared key (``hmac-sha256:<hex>``) is the development mode
(``DSEC_SIGNING_MODE=hmac-dev``): whoever can verify can also sign, so it has no roles.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel

from dsec.schemas.actuations import ActuationCommand
from dsec.schemas.base import now_ms as wall_clock_ms
from dsec.schemas.policies import PolicyDeletion, PolicySpec
from dsec.schemas.pools import PoolDeletion, PoolSpec
from dsec.schemas.trust import KeyRole, TrustedKey, TrustList, key_id_of, public_key_bytes

ED25519 = "ed25519"
SCHEME = "hmac-sha256"  # the development mode's
M = TypeVar("M", bound=BaseModel)

# Who may sign what. A command names its target and is applied by a worker; a policy or
# a deletion changes what the engine does for the whole fleet; a pool, the quotas and
# parameters of its workers.
SIGNING_ROLES: dict[type[BaseModel], tuple[KeyRole, ...]] = {
    ActuationCommand: (KeyRole.COMMAND_SIGNER,),
    PolicySpec: (KeyRole.POLICY_PUBLISHER,),
    PolicyDeletion: (KeyRole.POLICY_PUBLISHER,),
    PoolSpec: (KeyRole.POOL_PUBLISHER,),
    PoolDeletion: (KeyRole.POOL_PUBLISHER,),
}


class SignatureError(ValueError):
    """Missing, malformed or wrong signature, or a key that may not sign this."""


def roles_for(model: BaseModel) -> tuple[KeyRole, ...]:
    """The roles whose keys may sign ``model``."""
    try:
        return SIGNING_ROLES[type(model)]
    except KeyError:
        raise SignatureError(f"a {type(model).__name__} is not signed") from None


def canonical_bytes(model: BaseModel) -> bytes:
    body = model.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _with_signature(model: M, signature: str) -> M:
    return model.model_copy(update={"signature": signature})


class Signer(ABC):
    """Signs models: returns a copy carrying the signature."""

    @abstractmethod
    def sign(self, model: M) -> M: ...


class Ed25519Signer(Signer):
    """One private key: signs whatever it is given (the verifier checks the key's role)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()
        self.key_id = key_id_of(raw)

    def sign(self, model: M) -> M:
        signature = base64.b64encode(self._key.sign(canonical_bytes(model))).decode()
        return _with_signature(model, f"{ED25519}:{self.key_id}:{signature}")


class Keyring(Signer):
    """The keys one process holds, by role; each model is signed with a key of a role
    that may sign it (the policy engine: commands with its command-signer key, the policy
    and pool versions its meta-policies tune with its publisher keys when it has them)."""

    def __init__(self, signers: Mapping[KeyRole, Signer]) -> None:
        self._signers = dict(signers)

    def sign(self, model: M) -> M:
        roles = roles_for(model)
        for role in roles:
            signer = self._signers.get(role)
            if signer is not None:
                return signer.sign(model)
        wanted = " or ".join(roles)
        raise SignatureError(f"no {wanted} key here to sign a {type(model).__name__}")


def _hmac_digest(model: BaseModel, key: bytes) -> str:
    return hmac.new(key, canonical_bytes(model), hashlib.sha256).hexdigest()


class HmacSigner(Signer):
    """The development mode: one shared key signs everything."""

    def __init__(self, key: bytes) -> None:
        if not key:
            raise SignatureError("empty signing key")
        self.key = key

    def sign(self, model: M) -> M:
        return _with_signature(model, f"{SCHEME}:{_hmac_digest(model, self.key)}")


@dataclass(frozen=True)
class SignedBy:
    """The key a verified signature was made with."""

    key_id: str
    role: KeyRole | None  # None: the development mode's shared key, standing for any role
    pools: frozenset[str] = frozenset()


class Verifier(ABC):
    @abstractmethod
    def verify(self, model: BaseModel, now_ms: int | None = None) -> SignedBy:
        """The key that signed ``model``, if that key may sign it and is valid at
        ``now_ms`` (default: now); ``SignatureError`` with the reason otherwise."""


def _signature_of(model: BaseModel) -> str:
    signature = getattr(model, "signature", None)
    if not signature:
        raise SignatureError("unsigned")
    return signature


class HmacVerifier(Verifier):
    def __init__(self, key: bytes) -> None:
        self._key = key

    def verify(self, model: BaseModel, now_ms: int | None = None) -> SignedBy:
        scheme, _, digest = _signature_of(model).partition(":")
        if scheme != SCHEME or not digest:
            raise SignatureError(f"unknown signature scheme {scheme!r}")
        if not hmac.compare_digest(digest, _hmac_digest(model, self._key)):
            raise SignatureError("signature does not match")
        return SignedBy("hmac", None)


TrustSource = Callable[[], TrustList]


class TrustListVerifier(Verifier):
    """Verifies Ed25519 signatures against a trust list, asked for at every verification
    (a file source re-reads the file when it changes, so a revocation holds from the next
    command on). Public keys are parsed once per key id and kept."""

    def __init__(self, trust: TrustList | TrustSource) -> None:
        self._source: TrustSource = trust if callable(trust) else (lambda: trust)
        self._seen: TrustList | None = None
        self._entries: dict[str, TrustedKey] = {}
        self._public: dict[str, Ed25519PublicKey] = {}

    def _entry(self, key_id: str) -> TrustedKey | None:
        trust = self._source()
        if trust is not self._seen:
            self._entries = {key.key_id: key for key in trust.keys}
            self._seen = trust
        return self._entries.get(key_id)

    def _public_key(self, entry: TrustedKey) -> Ed25519PublicKey:
        public = self._public.get(entry.key_id)
        if public is None:
            public = Ed25519PublicKey.from_public_bytes(public_key_bytes(entry.public_key))
            self._public[entry.key_id] = public
        return public

    def verify(self, model: BaseModel, now_ms: int | None = None) -> SignedBy:
        scheme, _, rest = _signature_of(model).partition(":")
        key_id, _, encoded = rest.partition(":")
        if scheme != ED25519 or not key_id or not encoded:
            raise SignatureError(f"unknown signature scheme {scheme!r}")
        entry = self._entry(key_id)
        if entry is None:
            raise SignatureError(f"key {key_id[:16]!r} is not in the trust list")
        refusal = entry.refusal(now_ms if now_ms is not None else wall_clock_ms())
        if refusal is not None:
            raise SignatureError(refusal)
        roles = roles_for(model)
        if entry.role not in roles:
            raise SignatureError(f"key {key_id} is a {entry.role} key; a "
                                 f"{type(model).__name__} needs a {' or '.join(roles)} key")
        try:
            signature = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError("signature is not base64") from None
        try:
            self._public_key(entry).verify(signature, canonical_bytes(model))
        except InvalidSignature:
            raise SignatureError("signature does not match") from None
        return SignedBy(entry.key_id, entry.role, frozenset(entry.pools))


def new_keyring(
    roles: tuple[KeyRole, ...] = tuple(KeyRole), *, expires_at_ms: int,
    pools: tuple[str, ...] = (),
) -> tuple[Keyring, TrustList, dict[KeyRole, Ed25519PrivateKey]]:
    """A fresh Ed25519 key per role, the keyring that signs with them and the trust list
    that accepts them (``pools``: those the pool-publisher key is confined to)."""
    private = {role: Ed25519PrivateKey.generate() for role in roles}
    signers = {role: Ed25519Signer(key) for role, key in private.items()}
    trust = TrustList(keys=[
        TrustedKey(key_id=signer.key_id, role=role, public_key=signer.public_key,
                   expires_at_ms=expires_at_ms,
                   pools=list(pools) if role is KeyRole.POOL_PUBLISHER else [])
        for role, signer in signers.items()
    ])
    return Keyring(signers), trust, private

