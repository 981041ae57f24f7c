"""The trust list: the public keys a verifier accepts, each with one role, a validity
window and, once revoked, the time it was revoked. Workers, node actuators and the
gateway's webhook forwarder hold this and no private key.

The file is JSON or YAML: ``{"keys": [{"key_id": ..., "role": ..., "public_key": ...,
"expires_at_ms": ...}, ...]}``. A key id is derived from its public key, so an entry
cannot name one key and carry another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from dsec.schemas.base import EpochMs, Identifier, Model

ED25519_PUBLIC_KEY_BYTES = 32
KeyId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


class KeyRole(StrEnum):
    """What a key may sign: one role a key, so a stolen key of one role signs nothing else."""

    COMMAND_SIGNER = "command-signer"  # actuation commands: the policy engine's
    POLICY_PUBLISHER = "policy-publisher"  # any policy, and deletions
    POOL_PUBLISHER = "pool-publisher"  # pools (quotas, per-pool parameters), and deletions


def key_id_of(public_key: bytes) -> str:
    """The id a signature names its key by: the head of the raw public key's SHA-256."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def public_key_bytes(text: str) -> bytes:
    """The raw Ed25519 public key in a trust entry (standard base64 of 32 bytes)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("public_key is not base64") from None
    if len(raw) != ED25519_PUBLIC_KEY_BYTES:
        raise ValueError(f"public_key is {len(raw)} bytes, not {ED25519_PUBLIC_KEY_BYTES}")
    return raw


class TrustedKey(Model):
    key_id: KeyId
    role: KeyRole
    public_key: Annotated[str, Field(max_length=64)]
    expires_at_ms: EpochMs
    not_before_ms: EpochMs = 0
    # Refused from this time on; set by ``dsec keys revoke``.
    revoked_at_ms: EpochMs | None = None
    # A pool-publisher key's pools, when it is confined to some: it publishes and deletes
    # those pools only (none listed: any pool).
    pools: Annotated[list[Identifier], Field(max_length=64)] = Field(default_factory=list)
    note: Annotated[str, Field(max_length=256)] = ""

    @model_validator(mode="after")
    def _consistent(self) -> TrustedKey:
        if key_id_of(public_key_bytes(self.public_key)) != self.key_id:
            raise ValueError(f"key_id {self.key_id} is not the id of its public_key")
        if self.expires_at_ms <= self.not_before_ms:
            raise ValueError("expires_at_ms must be after not_before_ms")
        if self.pools and self.role is not KeyRole.POOL_PUBLISHER:
            raise ValueError("pools are given for a pool-publisher key only")
        return self

    def refusal(self, now_ms: int) -> str | None:
        """Why this key signs nothing at ``now_ms``; None while it is valid."""
        if self.revoked_at_ms is not None and now_ms >= self.revoked_at_ms:
            return f"key {self.key_id} was revoked at {self.revoked_at_ms}"
        if now_ms >= self.expires_at_ms:
            return f"key {self.key_id} expired at {self.expires_at_ms}"
        if now_ms < self.not_before_ms:
            return f"key {self.key_id} is not valid before {self.not_before_ms}"
        return None


class TrustList(Model):
    keys: Annotated[list[TrustedKey], Field(max_length=1024)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TrustList:
        ids = [key.key_id for key in self.keys]
        if len(ids) != len(set(ids)):
            raise ValueError("a key id appears twice")
        return self

    def get(self, key_id: str) -> TrustedKey | None:
        return next((key for key in self.keys if key.key_id == key_id), None)

    def with_key(self, key: TrustedKey) -> TrustList:
        """This list with ``key`` added, or replacing the entry of the same id."""
        return TrustList(keys=[*(k for k in self.keys if k.key_id != key.key_id), key])
