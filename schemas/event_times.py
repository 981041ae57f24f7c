"""The sample times dsec stores: no older than the store's TTL, no further ahead than a
bounded clock skew.

A sample outside the window would be accepted on the wire and then dropped by the table's
TTL at insert (``TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY`` in
``infra/store/schema.sql``) without a trace; refused here, it is dead-lettered with its
reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsec.schemas.base import now_ms as clock_ms
from dsec.schemas.codec import DecodeError
from dsec.schemas.units import s_to_ms

DAY_MS = 86_400_000


@dataclass(frozen=True)
class EventTimeWindow:
    ttl_days: int = 30  # the store's TTL (``DsecSettings.clickhouse_ttl_days``)
    max_future_s: float = 300.0  # ``DsecSettings.event_time_max_future_s``

    def bounds_ms(self, now_ms: int) -> tuple[int, int]:
        """The oldest and the newest time accepted at ``now_ms``, both inclusive."""
        return now_ms - self.ttl_days * DAY_MS, now_ms + s_to_ms(self.max_future_s)


def event_time_problem(times_ms: np.ndarray, window: EventTimeWindow, now_ms: int) -> str | None:
    """Why some of ``times_ms`` fall outside the window, or None when none does."""
    if not times_ms.size:
        return None
    oldest_ms, newest_ms = window.bounds_ms(now_ms)
    if times_ms.size <= 32:  # a probe's message at training rates: Python's min is cheaper
        values = times_ms.tolist()
        least, greatest = min(values), max(values)
    else:
        least, greatest = int(times_ms.min()), int(times_ms.max())
    if least < oldest_ms:
        return f"older than the store keeps ({window.ttl_days} days): {least} < {oldest_ms}"
    if greatest > newest_ms:
        return (f"more than {window.max_future_s:g} s in the future: "
                f"{greatest} > {newest_ms}")
    return None


def check_event_times(frames: dict[str, dict[str, np.ndarray]], window: EventTimeWindow,
                      now_ms: int | None = None, form: str = "columns") -> None:
    """Raises ``DecodeError`` naming the field (``columns.step.event_time_ms``) where a
    sample's time is outside the window."""
    now_ms = clock_ms() if now_ms is None else now_ms
    for kind, frame in frames.items():
        problem = event_time_problem(frame["event_time_ms"], window, now_ms)
        if problem is not None:
            raise DecodeError(f"invalid MetricBatch: {form}.{kind}.event_time_ms: {problem}")
