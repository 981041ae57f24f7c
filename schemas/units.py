"""Conversions between the units dsec's quantities carry.

Event times and ages are epoch or elapsed milliseconds (``*_ms``: integers on the wire and in
state); configuration and measured durations are seconds (``*_s``: floats). Every conversion
between them goes through these functions, so a reader finds one definition of each.
"""

from __future__ import annotations

from datetime import UTC, datetime

MS_PER_S = 1000


def s_to_ms(seconds: float) -> int:
    """Whole milliseconds in ``seconds``, truncated towards zero as ``int()`` does."""
    return int(seconds * MS_PER_S)


def duration_ms(seconds: float) -> float:
    """``seconds`` in milliseconds, fractions kept (measured latencies, thresholds)."""
    return seconds * MS_PER_S


def ms_to_s(milliseconds: float) -> float:
    """``milliseconds`` in seconds."""
    return milliseconds / MS_PER_S


def epoch_ms(moment: datetime) -> int:
    """The epoch milliseconds of an aware ``moment`` (a naive one is taken as local time,
    as ``datetime.timestamp`` does)."""
    return s_to_ms(moment.timestamp())


def from_epoch_ms(epoch_ms_value: float) -> datetime:
    """The UTC moment of ``epoch_ms_value``."""
    return datetime.fromtimestamp(ms_to_s(epoch_ms_value), tz=UTC)
