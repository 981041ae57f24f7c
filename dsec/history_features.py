"""Stored feature events read back from the history, for dry-run scoring of a policy on a
team's own workload (``dsec policy test --against-history``).

The features table keeps one row per feature; the rows of one event come back together
as that event. Tags are not stored, so a policy's selector on tags (pools, labels) and
an alert's tag placeholders see none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

from dsec.history import HistoryError, query
from dsec.schemas import FeatureEvent, WorkerIdentity
from dsec.schemas.settings import DsecSettings
from dsec.schemas.units import epoch_ms

__all__ = ["parse_since", "stored_feature_events"]

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str, now_ms: int) -> int:
    """``2h``, ``30m``, ``90s``, ``1d`` back from ``now_ms``, or an ISO date and time
    (UTC where it names no zone): epoch ms. ``ValueError`` otherwise."""
    span = _SPAN.match(text)
    if span:
        return now_ms - int(float(span.group(1)) * _UNIT_MS[span.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: give a span (2h, 30m, 1d) or an ISO date and "
                         "time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return epoch_ms(moment)


def stored_feature_events(settings: DsecSettings, since_ms: int, until_ms: int | None = None,
                          job_id: str | None = None) -> Iterator[FeatureEvent]:
    """The stored feature events from ``since_ms`` (to ``until_ms``), in event-time order."""
    where = ["event_time >= fromUnixTimestamp64Milli({since:Int64})"]
    parameters: dict[str, object] = {"since": since_ms}
    if until_ms is not None:
        where.append("event_time < fromUnixTimestamp64Milli({until:Int64})")
        parameters["until"] = until_ms
    if job_id is not None:
        where.append("job_id = {job:String}")
        parameters["job"] = job_id
    rows = query(settings, f"""
        SELECT toUnixTimestamp64Milli(event_time) AS time_ms, event_id, job_id, node_id,
               worker_id, gpu_uuid, window, groupArray(feature), groupArray(value)
        FROM features WHERE {' AND '.join(where)}
        GROUP BY time_ms, event_id, job_id, node_id, worker_id, gpu_uuid, window
        ORDER BY time_ms, event_id""", parameters)["rows"]
    for time_ms, event_id, job, node, worker, gpu_uuid, window, names, values in rows:
        try:
            yield FeatureEvent(
                event_id=event_id, event_time_ms=int(time_ms),
                identity=WorkerIdentity(job_id=job, node_id=node, worker_id=worker),
                gpu_uuid=gpu_uuid or None, window=window,
                features=dict(zip(names, values, strict=True)))
        except ValueError as exc:  # a row the contract no longer takes
            raise HistoryError(f"stored feature event {event_id}: {exc}") from None
