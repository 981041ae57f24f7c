"""Goodput measures from timelines: interruptions, recovery, lost work, effective time."""

from __future__ import annotations

import pytest

from dsec.experiment.measure import (
    OPTIMIZER_STEPS_PER_UPDATE,
    final_mean_return,
    measure_arm,
    measure_worker,
    return_curve,
)


def _update(t: float, updates: int, dur: float = 1.0, busy: float = 0.5) -> dict:
    return {"e": "update", "t": t, "updates": updates, "dur": dur, "busy_s": busy}


def test_a_healthy_worker_is_all_productive() -> None:
    events = [{"e": "resume", "t": 0.0, "updates": 0}] + [_update(t, t) for t in range(1, 11)]
    measure = measure_worker(events, 0.0, 10.0)
    assert measure.interruptions == 0
    assert measure.productive_s == 10.0
    assert measure.lost_work_s == 0.0
    assert measure.updates_kept == 10


def test_a_death_costs_recovery_and_the_work_since_the_resume_point() -> None:
    events = [
        {"e": "resume", "t": 0.0, "updates": 0},
        *[_update(float(t), t) for t in range(1, 7)],  # updates 1..6
        {"e": "death", "t": 6.5, "cause": "oom"},
        {"e": "resume", "t": 8.5, "updates": 4},  # resumed from update 4: 5 and 6 are lost
        _update(9.5, 5), _update(10.5, 6),
    ]
    measure = measure_worker(events, 0.0, 12.0)
    assert measure.interruptions == 1
    assert measure.causes == {"oom": 1}
    assert measure.recoveries_s == [2.0]
    assert measure.lost_work_s == 2.0
    assert measure.productive_s == 6.0
    assert measure.updates_kept == 6


def test_a_worker_still_down_at_the_end_counts_its_recovery_to_the_end() -> None:
    events = [{"e": "resume", "t": 0.0, "updates": 0}, _update(1.0, 1),
              {"e": "death", "t": 4.0, "cause": "nan"}]
    measure = measure_worker(events, 0.0, 10.0)
    assert (measure.interruptions, measure.recoveries_s, measure.unrecovered) == (1, [6.0], 1)
    arm = measure_arm({0: events}, 0.0, 10.0)
    assert (arm.recovery_mean_s, arm.unrecovered) == (6.0, 1)


def test_skipped_optimizer_steps_are_not_productive() -> None:
    events = [{"e": "resume", "t": 0.0, "updates": 0},
              {**_update(1.0, 1), "opt_steps": 8, "skipped": 2}, _update(2.0, 2),
              {**_update(3.0, 3), "opt_steps": 8, "skipped": 8}]
    measure = measure_worker(events, 0.0, 4.0)
    assert measure.productive_s == pytest.approx(1.75)
    assert measure.steps_skipped == 10
    assert measure.interruptions == 0
    assert measure_arm({0: events}, 0.0, 4.0).steps_skipped == 10


def test_a_survivor_that_rolls_back_loses_work_without_an_interruption() -> None:
    events = [{"e": "resume", "t": 0.0, "updates": 0}, _update(1, 1), _update(2, 2),
              {"e": "group_abort", "t": 2.5}, {"e": "resume", "t": 4.0, "updates": 0}]
    measure = measure_worker(events, 0.0, 5.0)
    assert (measure.interruptions, measure.lost_work_s, measure.productive_s) == (0, 2.0, 0.0)


def test_arm_totals_and_learning_outcome() -> None:
    timelines = {
        0: [{"e": "resume", "t": 0.0, "updates": 0}, _update(5.0, 1, dur=5.0, busy=4.0),
            {"e": "episode", "t": 2.0, "ret": 10.0}, {"e": "episode", "t": 9.0, "ret": 100.0},
            {"e": "action", "t": 3.0, "kind": "memory_cap"}],
        1: [{"e": "resume", "t": 0.0, "updates": 0}, {"e": "death", "t": 1.0, "cause": "crash"},
            {"e": "resume", "t": 4.0, "updates": 0}, _update(9.0, 1, dur=5.0, busy=3.0),
            {"e": "episode", "t": 9.5, "ret": 50.0}, {"e": "episode", "t": 9.6, "ret": 50.0}],
    }
    arm = measure_arm(timelines, 0.0, 10.0)
    assert arm.interruptions == 1
    assert arm.recovery_mean_s == pytest.approx(3.0)
    assert arm.effective_training_time_ratio == pytest.approx(10.0 / 20.0)
    assert arm.gpu_utilisation == pytest.approx(7.0 / 20.0)
    assert arm.steps == 2 * OPTIMIZER_STEPS_PER_UPDATE
    assert arm.final_mean_return == pytest.approx(75.0)  # (100 + 50) / 2 workers
    assert arm.actions == {"memory_cap": 1}
    assert arm.deaths == [{"worker": 1, "t": 1.0, "cause": "crash"}]
    assert return_curve(timelines, 0.0, 10.0, bins=2) == [10.0, pytest.approx(66.67)]
    assert final_mean_return({}, 0.0, 10.0) is None


def test_only_applied_actions_count_and_the_other_outcomes_are_kept_apart() -> None:
    def action(t: float, kind: str, status: str) -> dict:
        return {"e": "action", "t": t, "kind": kind, "status": status}

    timelines = {0: [{"e": "resume", "t": 0.0, "updates": 0},
                     action(1.0, "memory_cap", "deferred"), action(2.0, "memory_cap", "applied"),
                     action(3.0, "sync_priority", "unsupported"),
                     {"e": "paused_update", "t": 4.0, "updates": 1, "dur": 1.0, "busy_s": 0.0}]}
    arm = measure_arm(timelines, 0.0, 10.0)
    assert arm.actions == {"memory_cap": 1}
    assert arm.actions_not_applied == {"memory_cap:deferred": 1, "sync_priority:unsupported": 1}
    assert [a["t"] for a in arm.action_timeline] == [2.0]
    assert arm.effective_training_time_ratio == 0.0  # a paused worker's updates are not its own


def test_degraded_time_by_mode_and_what_a_paused_step_contributes() -> None:
    events = [
        {"e": "resume", "t": 0.0, "updates": 0},
        _update(1.0, 1),
        {**_update(2.0, 2), "dtype": "fp16", "window": 2},
        {**_update(3.0, 3), "bits": 4},
        {"e": "paused_update", "t": 4.0, "updates": 4, "dur": 1.0},
    ]
    measure = measure_worker(events, 0.0, 4.0)
    assert measure.degraded_s == {"fp16": 1.0, "accumulation": 1.0, "4-bit": 1.0,
                                  "sampler_paused": 1.0}
    assert measure.degraded_any_s == 3.0
    assert measure.productive_s == 3.0  # the paused step contributed no data
    assert measure.updates_done == 4
    arm = measure_arm({0: events}, 0.0, 4.0)
    assert arm.degraded_ratio == pytest.approx(0.75)
    assert arm.steps_per_s == pytest.approx(4 * OPTIMIZER_STEPS_PER_UPDATE / 4.0)


def test_the_area_under_the_return_curve_counts_empty_stretches_as_nothing() -> None:
    from dsec.experiment.measure import return_auc

    assert return_auc([10.0, None, 30.0], 0.0, 30.0) == pytest.approx(400.0)
