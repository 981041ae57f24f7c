"""Whether a silent worker is lost: its silence measured in event time against the
stream's progress as well as on the job's clock, so that a stall of the input (nothing
arriving from anyone) is not taken for the loss of every worker.

Pure functions over what the metrics job keeps per worker; ``worker_features.liveness``
applies them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dsec.schemas.units import duration_ms

__all__ = ["SilenceRule", "SilenceVerdict", "judge_silence", "stream_progress_ms"]


@dataclass(frozen=True, slots=True)
class SilenceRule:
    """``timeout_s``: the silence, on both clocks, after which a worker is overdue.
    ``grace_s``: how long (job's clock) an overdue worker stays unheard before it is
    lost. After a stall of the whole input, the backlogs of many producers come back in
    no particular order: one worker's may be read a moment before another's, and the
    grace lets the other's arrive."""

    timeout_s: float
    grace_s: float = 0.0
    # How long the whole input may stand still before silence on the job's clock alone
    # counts: a stall passes, but a job whose workers all died stays silent.
    stall_limit_s: float = 60.0


@dataclass(frozen=True, slots=True)
class SilenceVerdict:
    """``overdue_since_ms``: when (job's clock) the worker was first found overdue in this
    silence, to keep; None while it is not overdue."""

    lost: bool
    overdue_since_ms: int | None


def stream_progress_ms(last_event_ms: Iterable[int | None], now_ms: int) -> int | None:
    """How far the stream has come in event time: the newest heartbeat event time of any
    worker (epoch ms), but never past the job's clock, so that a worker whose clock runs
    fast does not make all the others look silent. None when no worker has one."""
    newest = max((t for t in last_event_ms if t is not None), default=None)
    return None if newest is None else min(newest, now_ms)


def judge_silence(
    *, last_seen_ms: int, last_event_ms: int | None, progress_ms: int | None,
    overdue_since_ms: int | None, now_ms: int, rule: SilenceRule,
) -> SilenceVerdict:
    """``last_seen_ms``: when (job's clock) the worker's last heartbeat was read;
    ``last_event_ms``: that heartbeat's event time (None for a state kept before event
    times were, judged on the job's clock alone); ``progress_ms``: the stream's progress
    (``stream_progress_ms``).

    Overdue when silent longer than the timeout on the job's clock and the stream has gone
    on past the worker's last heartbeat by more than the timeout too; lost once overdue
    for the grace. While nothing arrives from anyone, the progress stands still and no
    worker becomes overdue until the silence on the job's clock outlasts the timeout and
    ``stall_limit_s`` together: a stall of the input passes, the death of every worker
    does not. The job's clock is asked
    as well, so that a worker whose clock lags behind the others', still heard from, is
    not taken for silent."""
    timeout_ms = duration_ms(rule.timeout_s)
    silent_ms = now_ms - last_seen_ms
    silent_here = silent_ms > timeout_ms
    if last_event_ms is None or silent_ms > timeout_ms + duration_ms(rule.stall_limit_s):
        silent_in_stream = True  # no event time to judge by, or longer than any stall
    else:
        silent_in_stream = progress_ms is not None and progress_ms - last_event_ms > timeout_ms
    if not (silent_here and silent_in_stream):
        return SilenceVerdict(lost=False, overdue_since_ms=None)
    since_ms = now_ms if overdue_since_ms is None else overdue_since_ms
    return SilenceVerdict(lost=now_ms - since_ms >= duration_ms(rule.grace_s),
                          overdue_since_ms=since_ms)
