"""The reaction bench's figures: pure functions over the worker's and Kafka's timestamps."""

from __future__ import annotations

import pytest

from dsec.bench.reaction_figures import (
    STAGES,
    StageTimes,
    TrialRecord,
    reaction_figures,
    stage_split_ms,
    summarise_ms,
)

MS = 1_000_000  # ns


def _record(worker_id: str, recorded_ms: int, applied_ms: int | None,
            warmup: bool = False) -> TrialRecord:
    return TrialRecord(trial=0, worker_id=worker_id, warmup=warmup, recorded_ns=recorded_ms * MS,
                       applied_ns=None if applied_ms is None else applied_ms * MS,
                       applied_dtype=None if applied_ms is None else "fp16")


def test_summary_of_latencies() -> None:
    summary = summarise_ms([float(v) for v in range(1, 101)])
    assert summary == {"count": 100, "min_ms": 1.0, "p50_ms": 50.5, "p99_ms": 99.01,
                       "max_ms": 100.0, "mean_ms": 50.5}
    assert summarise_ms([7.0])["p99_ms"] == 7.0


def test_summary_of_nothing_has_no_figures() -> None:
    assert summarise_ms([]) == {"count": 0, "min_ms": None, "p50_ms": None, "p99_ms": None,
                                "max_ms": None, "mean_ms": None}


def test_stages_add_up_to_the_whole() -> None:
    record = _record("w", recorded_ms=1_000, applied_ms=1_450)
    split = stage_split_ms(record, StageTimes(published_ms=1_060, features_ms=1_200,
                                              command_ms=1_390))
    assert split == {"recorded_to_published": 60.0, "published_to_features": 140.0,
                     "features_to_command": 190.0, "command_to_applied": 60.0}
    assert sum(split.values()) == pytest.approx(450.0)


def test_a_missing_timestamp_leaves_its_two_stages_out() -> None:
    split = stage_split_ms(_record("w", 1_000, 1_450),
                           StageTimes(published_ms=1_060, command_ms=1_390))
    assert split["published_to_features"] is None and split["features_to_command"] is None
    assert split["recorded_to_published"] == 60.0 and split["command_to_applied"] == 60.0
    assert stage_split_ms(_record("w", 1_000, None), StageTimes())["command_to_applied"] is None


def test_figures_count_missed_trials_and_leave_warmups_out() -> None:
    records = [
        _record("warm", 0, 30_000, warmup=True),  # the stack starting: not a measurement
        _record("a", 1_000, 1_300),
        _record("b", 2_000, 2_500),
        _record("c", 3_000, None),  # missed
    ]
    stages = {
        "a": StageTimes(published_ms=1_100, features_ms=1_150, command_ms=1_250),
        "b": StageTimes(published_ms=2_100, features_ms=2_200, command_ms=2_400),
        "c": StageTimes(published_ms=3_100),
    }
    figures = reaction_figures(records, stages)
    assert (figures["trials"], figures["applied"], figures["missed"]) == (3, 2, 1)
    assert figures["latencies_ms"] == [200.0, 400.0]  # from the probe's publishing
    assert figures["p50_ms"] == 300.0 and figures["max_ms"] == 400.0
    assert figures["recorded_to_applied_ms"]["max_ms"] == 500.0
    assert set(figures["stages_ms"]) == set(STAGES)
    assert figures["stages_ms"]["features_to_command"]["min_ms"] == 100.0
