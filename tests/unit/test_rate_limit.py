"""The per-worker command cap: a sliding window of event time, per worker."""

from __future__ import annotations

from dsec.policy_engine.rate_limit import CommandBudget, admit


def test_admit_keeps_at_most_cap_times_in_the_window() -> None:
    sent: list[int] = []
    verdicts = []
    for now_ms in range(0, 120_000, 10_000):
        allowed, sent = admit(sent, now_ms, cap=4)
        verdicts.append(allowed)
        assert len(sent) <= 4
    assert verdicts == [True] * 4 + [False] * 2 + [True] * 4 + [False] * 2


def test_a_worker_replaying_old_events_keeps_its_count_beside_live_workers() -> None:
    """A backlog ten minutes behind another worker's live events, in the same batches."""
    budget = CommandBudget(per_min=4)
    live_ms = 10_000_000
    old_ms = live_ms - 600_000
    admitted = []
    for i in range(6):
        budget.admit("live", live_ms + i * 10_000)
        budget.forget_idle(live_ms + i * 10_000)
        admitted.append(budget.admit("old", old_ms + i * 10_000))
    assert admitted == [True] * 4 + [False] * 2


def test_idle_workers_are_forgotten() -> None:
    budget = CommandBudget(per_min=1, idle_ms=120_000)
    assert budget.admit("w", 0)
    assert not budget.admit("w", 30_000)
    budget.forget_idle(119_999)
    assert not budget.admit("w", 59_999)
    budget.forget_idle(200_000)
    assert budget.admit("w", 30_000)  # forgotten: its count starts again
