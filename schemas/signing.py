"""Signatures for what arrives over the wire and changes a worker: HMAC-SHA256 over
the canonical JSON of the model without its ``signature`` field."""

from __future__ import annotations

import hashlib
import hmac
from typing import TypeVar

import orjson
from pydantic import BaseModel

SCHEME = "hmac-sha256"
M = TypeVar("M", bound=BaseModel)


class SignatureError(ValueError):
    """Missing, malformed or wrong signature."""


def canonical_bytes(model: BaseModel) -> bytes:
    body = model.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _digest(model: BaseModel, key: bytes) -> str:
    return hmac.new(key, canonical_bytes(model), hashlib.sha256).hexdigest()


def sign(model: M, key: bytes) -> M:
    """A copy of ``model`` carrying its signature."""
    if not key:
        raise SignatureError("empty signing key")
    return model.model_copy(update={"signature": f"{SCHEME}:{_digest(model, key)}"})


def verify(model: BaseModel, key: bytes) -> None:
    signature = getattr(model, "signature", None)
    if not signature:
        raise SignatureError("unsigned")
    scheme, _, digest = signature.partition(":")
    if scheme != SCHEME or not digest:
        raise SignatureError(f"unknown signature scheme {scheme!r}")
    if not hmac.compare_digest(digest, _digest(model, key)):
        raise SignatureError("signature does not match")
