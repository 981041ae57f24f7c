"""Request bodies read with a size limit while they stream in, and parsed as strict JSON.

Strict: RFC 8259 only (no NaN, Infinity or numbers that overflow a double), and nested no
deeper than a limit, so a hostile body gets a clear refusal rather than a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson


class BodyError(ValueError):
    """A body refused before validation; ``code`` is the gateway's error code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


async def read_limited(chunks: AsyncIterator[bytes], limit_bytes: int) -> bytes:
    """The body, or ``BodyError("too_large")`` as soon as more than ``limit_bytes`` came."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit_bytes:
            raise BodyError("too_large", f"body over {limit_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


def depth_of(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar: 0, ``[]``: 1)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_strict(raw: bytes, max_depth: int) -> Any:
    """The JSON value of ``raw``; ``BodyError`` when it is not strict JSON or too deep."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise BodyError("too_deep", f"JSON nested deeper than {max_depth}") from None
        raise BodyError("invalid_json", f"the body is not JSON: {exc}") from None
    if depth_of(value) > max_depth:
        raise BodyError("too_deep", f"JSON nested deeper than {max_depth}")
    return value
