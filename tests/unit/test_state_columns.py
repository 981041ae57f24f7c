"""The column check that lets the engine skip rows: wherever it says a row is settled,
``decide`` (and the alert bookkeeping around it) leaves that row's state as it is and
decides nothing. Checked against ``decide`` itself over random states and inputs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dsec.policy_engine.decide import PolicyState, decide
from dsec.policy_engine.state_columns import NONE_MS, Gathered, StateColumns, Timing, settled
from dsec.schemas import PolicySpec
from dsec.schemas.policies import DecisionKind

SNAPSHOT = {"params": {"kind": "snapshot"}}
POLICIES = {
    "one-shot": {"condition": "x > 1.0", "for_s": 10, "cooldown_s": 60, "action": SNAPSHOT},
    "no-for": {"condition": "x > 1.0", "for_s": 0, "cooldown_s": 90, "action": SNAPSHOT},
    "alerting": {"condition": "x > 1.0", "for_s": 5, "cooldown_s": 60, "action": SNAPSHOT,
                 "alert": "hot {worker_id}"},
    "staged": {"condition": "x > 1.0", "for_s": 10, "cooldown_s": 30,
               "stage_interval_s": 20, "hold_s": 40,
               "stages": [{"actions": [{"kind": "grad_accumulation", "steps": 2}]},
                          {"actions": [{"kind": "grad_accumulation", "steps": 4}]}]},
}
NOW_MS = 1_000_000


def _spec(name: str) -> PolicySpec:
    return PolicySpec.model_validate({"name": name, **POLICIES[name]})


def _random_state(rng: np.random.Generator, stages: int) -> PolicyState:
    def when() -> int | None:
        return None if rng.random() < 0.4 else NOW_MS - int(rng.integers(0, 120_000))

    return PolicyState(pending_since_ms=when(), last_fired_ms=when(),
                       suppressed_audited=bool(rng.random() < 0.5),
                       stage=int(rng.integers(0, stages + 1)), stage_since_ms=when(),
                       clear_since_ms=when(), alert_open=bool(rng.random() < 0.3))


def _gathered(states: list[PolicyState]) -> Gathered:
    def times(name: str) -> np.ndarray:
        return np.array([NONE_MS if getattr(s, name) is None else getattr(s, name)
                         for s in states], dtype=np.int64)

    return Gathered(times("pending_since_ms"), times("last_fired_ms"),
                    times("stage_since_ms"), times("clear_since_ms"),
                    np.array([s.stage for s in states]),
                    np.array([s.suppressed_audited for s in states]),
                    np.array([s.alert_open for s in states]))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_settled_row_is_one_decide_leaves_alone(name: str) -> None:
    spec = _spec(name)
    timing = Timing.of(spec, cooldown_floor_s=0.0)
    rng = np.random.default_rng(7)
    rows = 4000
    states = [_random_state(rng, timing.stages) for _ in range(rows)]
    enter = rng.random(rows) < 0.6
    exit_ = ~enter & (rng.random(rows) < 0.7)
    # each row's draw of a ``jitter_s`` of 20 s, in half of the rows
    jitter_ms = np.where(rng.random(rows) < 0.5, rng.integers(0, 20_000, rows), 0)
    quiet = settled(timing, _gathered(states), enter, enter, exit_,
                    np.full(rows, NOW_MS, dtype=np.int64), top=timing.stages,
                    cooldown_jitter_ms=jitter_ms)
    assert 0 < quiet.sum() < rows  # both kinds of rows are met
    for row in np.flatnonzero(quiet):
        old = states[row]
        new, kind = decide(spec, old, bool(enter[row]), NOW_MS, exit_holds=bool(exit_[row]),
                           climb_holds=True, cooldown_jitter_ms=int(jitter_ms[row]))
        assert (new, kind) == (old, None), (row, old)
        if timing.resolves_alerts:
            assert not (old.alert_open and not enter[row])


def test_unsettled_rows_include_every_firing() -> None:
    spec = _spec("no-for")
    timing = Timing.of(spec, cooldown_floor_s=0.0)
    states = [PolicyState(), PolicyState(last_fired_ms=NOW_MS - 100_000,
                                         pending_since_ms=NOW_MS - 5_000)]
    quiet = settled(timing, _gathered(states), np.array([True, True]),
                    np.array([True, True]), np.array([False, False]),
                    np.full(2, NOW_MS, dtype=np.int64), top=1)
    assert not quiet.any()
    assert decide(spec, states[1], True, NOW_MS)[1] is DecisionKind.FIRED


def test_columns_mirror_the_mapping_and_read_it_again_when_told() -> None:
    states = {"p|job|w1": PolicyState(last_fired_ms=5, stage=1, stage_since_ms=5)}
    targets = ["job|w0", "job|w1"]
    columns = StateColumns("p|", states, targets)
    slots = np.array([0, 1])
    columns.load(slots)
    assert columns.present.tolist()[:2] == [False, True]
    assert columns.gather(slots).last_fired_ms.tolist() == [NONE_MS, 5]
    states["p|job|w0"] = replace(PolicyState(), pending_since_ms=9)
    columns.load(slots)  # read once: a change behind its back is not seen
    assert not columns.present[0]
    columns.forget_cached()
    columns.load(slots)
    assert columns.present[0] and columns.gather(slots).pending_since_ms[0] == 9
    # A state gone from the mapping (another engine took the target back to idle) leaves
    # its slot's columns empty when read again.
    del states["p|job|w1"]
    columns.forget_cached()
    columns.load(slots)
    gathered = columns.gather(slots)
    assert columns.present.tolist()[:2] == [True, False]
    assert gathered.last_fired_ms.tolist() == [NONE_MS, NONE_MS]
    assert gathered.stage.tolist() == [0, 0] and gathered.stage_since_ms[1] == NONE_MS
