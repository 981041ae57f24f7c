"""The detection bench's parts without a broker: traces that are the same for a seed and
label their faults, the scoring, and a short trace through the stages in one process."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dsec.bench.detection_offline import run_offline
from dsec.bench.detection_score import Firing, score
from dsec.bench.detection_traces import DetectionTrace, FaultLabel, TraceSpec
from dsec.bench.detection_workloads import (
    FAULT_CLASSES,
    HELD_OUT_SEEDS,
    HELD_OUT_SHAPES,
    SHAPES,
    TUNING_SEEDS,
    TUNING_SHAPES,
)
from dsec.cli import app

START_MS = 1_800_000_000_000


def test_tuning_and_held_out_sets_do_not_overlap() -> None:
    assert not set(TUNING_SHAPES) & set(HELD_OUT_SHAPES)
    assert not set(TUNING_SEEDS) & set(HELD_OUT_SEEDS)
    assert set(TUNING_SHAPES) | set(HELD_OUT_SHAPES) == set(SHAPES)
    assert len(HELD_OUT_SHAPES) >= 3 and len(HELD_OUT_SEEDS) >= 3


def test_a_seed_gives_the_same_trace_and_labels_one_fault_of_each_class() -> None:
    spec = TraceSpec("robotics", 101, workers=8, duration_s=60, onset_window_s=(5, 20))

    def documents() -> tuple[list, list[FaultLabel]]:
        trace = DetectionTrace(spec, START_MS - 60_000)
        history = list(trace.documents(START_MS - 60_000, START_MS, 10_000))
        labels = trace.start(START_MS)
        return history + list(trace.documents(START_MS, trace.end_ms, 1000)), labels

    first, labels = documents()
    second, again = documents()
    assert first == second and [x.to_json() for x in labels] == [x.to_json() for x in again]
    assert sorted(label.fault_class for label in labels) == sorted(FAULT_CLASSES)
    targets = [t for label in labels for t in label.targets]
    assert len(targets) == len(set(targets))  # one fault a worker
    card = next(label for label in labels if label.fault_class == "card_degraded")
    assert len(card.targets) == SHAPES["robotics"].workers_per_card
    # every signal that can exist within the run did, after its onset
    for label in labels:
        if label.signal_ms is not None:
            assert label.onset_ms <= label.signal_ms <= START_MS + 60_000
    nan = next(label for label in labels if label.fault_class == "nan_burst")
    assert nan.signal_ms is not None


def _label(fault_class: str, targets: tuple[str, ...], onset_s: int, end_s: int,
           signal_s: int | None) -> FaultLabel:
    return FaultLabel(fault_class, targets, START_MS + onset_s * 1000, START_MS + end_s * 1000,
                      None if signal_s is None else START_MS + signal_s * 1000)


def _fired(at_s: float, policy: str, worker: str) -> Firing:
    return Firing(START_MS + int(at_s * 1000), policy, "job", worker)


def test_scoring_counts_detections_false_firings_and_healthy_commands() -> None:
    labels = {"job": [
        _label("memory_leak", ("w1",), 10, 100, 20),
        _label("card_degraded", ("w2", "w3"), 30, 60, 31),
        _label("variance_jump", ("w4",), 40, 100, None),  # its signal never came
    ]}
    firings = [
        _fired(21, "elastic-memory-quota", "w1"), _fired(21, "elastic-memory-quota", "w1"),
        _fired(32, "gpu-degradation-snapshot", "w2"),
        _fired(50, "elastic-memory-quota", "w5"),             # a healthy worker
        _fired(70, "gpu-degradation-snapshot", "w3"),        # after the card's label ended
        _fired(55, "worker-lost", "w6"), _fired(5, "periodic-snapshot", "w6"),
    ]
    commands = [*firings, _fired(33, "stuck-episode", "w1")]  # w1 is under a fault
    result = score(labels, firings, commands)
    leak, card = result["classes"]["memory_leak"], result["classes"]["card_degraded"]
    assert (leak["firings"], leak["false_firings"], leak["recall"]) == (2, 1, 1.0)
    assert leak["latency_s"]["p50"] == 1.0
    assert (card["detected"], card["targets"], card["precision"]) == (1, 2, 0.5)
    assert result["classes"]["variance_jump"]["no_signal"] == 1
    overall = result["overall"]
    assert (overall["detected"], overall["targets"], overall["firings"]) == (2, 3, 5)
    assert (overall["precision"], overall["recall"]) == (0.4, 0.6667)  # to 4 places
    assert result["other_policies_fired"] == {"worker-lost": 1}
    assert result["corrective_commands_on_healthy_workers_by_policy"] == {
        "elastic-memory-quota": 1, "gpu-degradation-snapshot": 1, "worker-lost": 1}
    assert [m["target"] for m in result["missed"]] == ["w3"]


def test_a_short_trace_through_the_stages_detects_every_class() -> None:
    # A tuning shape: six workers on three cards, ten minutes of history, a minute of faults.
    spec = TraceSpec("atari", 1, workers=6, duration_s=60, onset_window_s=(5, 20))
    trace = DetectionTrace(spec, START_MS - 600_000)
    run = run_offline([trace], START_MS, preroll_s=600, interval_s=1.0)
    result = score({spec.job_id: trace.labels}, run.firings, run.commands)
    assert run.dead_letters == 0
    assert result["overall"]["recall"] == 1.0, json.dumps(result["missed"])
    assert result["overall"]["precision"] == 1.0, result["other_policies_fired"]
    assert result["corrective_commands_on_healthy_workers"] == 0
    assert result["overall"]["latency_s"]["p50"] <= 5.0


def test_the_cli_refuses_an_unknown_shape() -> None:
    result = CliRunner().invoke(app, ["bench", "detection", "--shapes", "chess"])
    assert result.exit_code == 2 and "no workload shapes chess" in result.output
