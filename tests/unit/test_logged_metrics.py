"""A framework's logged metrics as samples: the keys each integration reads, and the step
sample a log becomes (``Probe.record_logged_step``), on the recording transport."""

from __future__ import annotations

import math

from recording import RecordingTransport, manual_probe

from dsec.ingest.integrations.logged import LoggedKeys, first_number, record_logged
from dsec.ingest.integrations.verl import VERL_KEYS, DsecTracking, attach

KEYS = LoggedKeys(loss=("loss",), grad_norm=("grad_norm",), step_time_s=("step_time",),
                  reward=("reward", "objective/scores"), length=("completions/mean_length",))


def test_first_number_takes_the_first_key_holding_a_number() -> None:
    metrics = {"a": "text", "b": True, "c": 2, "d": 3.5, "e": float("nan")}
    assert first_number(metrics, ("missing", "a", "b", "c", "d")) == 2.0
    assert math.isnan(first_number(metrics, ("e",)))
    assert first_number(metrics, ("a", "b")) is None


def test_a_log_becomes_one_step_and_one_episode_and_the_step_count_stays() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    assert record_logged(probe, 7, {"loss": 0.5, "grad_norm": 1.5, "step_time": 0.25,
                                    "objective/scores": 3.0, "completions/mean_length": 11.6},
                         KEYS) == (True, True)
    assert record_logged(probe, 8, {"learning_rate": 1e-3}, KEYS) == (False, False)
    assert record_logged(probe, 9, {"loss": float("nan"), "reward": float("inf")},
                         KEYS) == (True, False)
    probe.flush()
    steps = transport.samples("step")
    assert [(s.step, s.loss, s.grad_norm, s.step_time_ms, s.grad_norm_source) for s in steps] \
        == [(7, 0.5, 1.5, 250.0, "trainer"), (9, None, None, None, None)]
    assert steps[1].loss_nonfinite and not steps[1].grad_nonfinite
    assert [(e.reward, e.length) for e in transport.samples("episode")] == [(3.0, 12)]
    assert probe.global_step == 0  # a logged step is a sample, not a step of the probe's


def test_the_verl_backend_reads_verls_names_and_attaches_once() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    tracking = type("Tracking", (), {})()
    tracking.logger = {"console": object()}
    backend = attach(tracking, probe)
    assert attach(tracking, probe) is backend and tracking.logger["dsec"] is backend
    backend.log(data={"actor/pg_loss": -0.1, "actor/grad_norm": 0.75,
                      "critic/score/mean": 0.6, "response_length/mean": 210.4,
                      "timing_s/step": 12.0, "perf/mfu/actor": 0.3}, step=3)
    backend.finish()
    probe.flush()
    [step] = transport.samples("step")
    assert (step.step, step.loss, step.grad_norm, step.step_time_ms) == (3, -0.1, 0.75, 12000.0)
    assert [(e.reward, e.length) for e in transport.samples("episode")] == [(0.6, 210)]
    assert backend.steps_logged == 1 and VERL_KEYS.reward[0] == "critic/score/mean"
    assert isinstance(backend, DsecTracking)
