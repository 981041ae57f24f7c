"""A worker's silence judged in event time against the stream's progress (pure)."""

from __future__ import annotations

from dsec.stream_jobs.silence import (
    SilenceRule,
    SilenceVerdict,
    judge_silence,
    stream_progress_ms,
)

RULE = SilenceRule(timeout_s=15.0, grace_s=2.0)
T0_MS = 1_800_000_000_000  # the worker's last heartbeat, read as it was sent


def _judge(now_ms: int, progress_ms: int | None, overdue_since_ms: int | None = None,
           last_event_ms: int | None = T0_MS) -> SilenceVerdict:
    return judge_silence(last_seen_ms=T0_MS, last_event_ms=last_event_ms,
                         progress_ms=progress_ms, overdue_since_ms=overdue_since_ms,
                         now_ms=now_ms, rule=RULE)


def test_progress_is_the_newest_heartbeat_but_not_past_the_clock() -> None:
    assert stream_progress_ms([T0_MS, None, T0_MS + 4_000], T0_MS + 9_000) == T0_MS + 4_000
    assert stream_progress_ms([T0_MS + 60_000], T0_MS + 9_000) == T0_MS + 9_000  # fast clock
    assert stream_progress_ms([None], T0_MS) is None
    assert stream_progress_ms([], T0_MS) is None


def test_a_worker_silent_while_the_others_go_on_is_lost_after_the_grace() -> None:
    first = _judge(T0_MS + 16_000, progress_ms=T0_MS + 15_500)
    assert first == SilenceVerdict(lost=False, overdue_since_ms=T0_MS + 16_000)
    still = _judge(T0_MS + 17_000, T0_MS + 16_500, first.overdue_since_ms)
    assert not still.lost and still.overdue_since_ms == first.overdue_since_ms
    lost = _judge(T0_MS + 18_000, T0_MS + 17_500, first.overdue_since_ms)
    assert lost == SilenceVerdict(lost=True, overdue_since_ms=T0_MS + 16_000)


def test_nobody_is_lost_while_nothing_arrives_from_anyone_for_less_than_the_stall_limit() -> None:
    """A stall of the whole input (timeout 15 s, stall limit 60 s) loses nobody; silence on
    the job's clock past both is the loss of the worker all the same (every worker of a
    job that died at once)."""
    for now_ms in (T0_MS + 16_000, T0_MS + 60_000, T0_MS + 75_000):
        assert _judge(now_ms, progress_ms=T0_MS + 3_000) == SilenceVerdict(False, None)
        assert _judge(now_ms, progress_ms=None) == SilenceVerdict(False, None)
    overdue = _judge(T0_MS + 75_001, progress_ms=T0_MS + 3_000)
    assert overdue == SilenceVerdict(lost=False, overdue_since_ms=T0_MS + 75_001)
    lost = _judge(T0_MS + 77_001, None, overdue.overdue_since_ms)
    assert lost == SilenceVerdict(lost=True, overdue_since_ms=T0_MS + 75_001)


def test_a_stream_ahead_of_a_worker_heard_from_lately_is_not_its_silence() -> None:
    # Its clock lags the others' by a minute, but the job read it a moment ago.
    verdict = judge_silence(last_seen_ms=T0_MS + 59_000, last_event_ms=T0_MS,
                            progress_ms=T0_MS + 60_000, overdue_since_ms=None,
                            now_ms=T0_MS + 60_000, rule=RULE)
    assert verdict == SilenceVerdict(False, None)


def test_overdue_no_longer_once_the_silence_is_within_the_timeout() -> None:
    assert _judge(T0_MS + 14_000, T0_MS + 14_000, overdue_since_ms=T0_MS) == \
        SilenceVerdict(False, None)


def test_a_state_without_event_times_is_judged_on_the_clock_alone() -> None:
    assert _judge(T0_MS + 16_000, progress_ms=None, last_event_ms=None,
                  overdue_since_ms=T0_MS + 13_000).lost
    assert not _judge(T0_MS + 14_000, progress_ms=None, last_event_ms=None).lost
