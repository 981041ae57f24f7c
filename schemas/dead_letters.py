"""What a stream job could not use, with the reason and enough to find the original."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from pydantic import Field

from dsec.schemas.base import Count, Event

MAX_PAYLOAD_BYTES = 64 * 1024


class DeadLetter(Event):
    source_topic: Annotated[str, Field(max_length=249)]
    partition: Annotated[int, Field(ge=0, le=2**31 - 1)]  # Kafka's are int32
    offset: Count
    reason: Annotated[str, Field(max_length=4096)]
    payload: str
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_truncated: bool = False

    @classmethod
    def for_message(
        cls, *, topic: str, partition: int, offset: int, reason: str, payload: bytes | None
    ) -> DeadLetter:
        raw = payload or b""
        truncated = len(raw) > MAX_PAYLOAD_BYTES
        raw = raw[:MAX_PAYLOAD_BYTES]
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        return cls(
            source_topic=topic,
            partition=partition,
            offset=offset,
            reason=reason[:4096],
            payload=text,
            payload_encoding=encoding,
            payload_truncated=truncated,
        )
