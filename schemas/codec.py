"""Wire encoding: compact JSON (orjson), validated against the models on the way in."""

from __future__ import annotations

import base64
from typing import TypeVar

import orjson
import pybase64
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class DecodeError(ValueError):
    """A message that is not a valid ``model``; ``reason`` is fit for a dead letter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(model: BaseModel) -> bytes:
    return orjson.dumps(model.model_dump(mode="json", exclude_none=True))


def describe(exc: ValidationError, limit: int = 10) -> str:
    """The first ``limit`` problems, each with the field at fault: ``samples.0.reward: ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()[:limit]
    )


def decode(data: bytes | str | None, model: type[M]) -> M:
    if data is None:
        raise DecodeError("empty message (tombstone) where an event was expected")
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise DecodeError(f"invalid {model.__name__}: {describe(exc)}") from None


def base64_bytes(data: str) -> bytes:
    """``base64.b64decode(data, validate=True)``, twenty times faster; ``binascii.Error``
    (a ``ValueError``) where it is not base64.

    pybase64 (SIMD) refuses some input the standard library takes, such as padding after a
    complete quantum ("AAAA="); the standard library has the last word on what pybase64
    refuses, so every input gets the standard library's verdict and bytes."""
    try:
        return pybase64.b64decode(data, validate=True)
    except ValueError:
        return base64.b64decode(data, validate=True)
