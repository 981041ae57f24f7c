"""The experiment's asynchronous sampling thread at the sampler gate."""

from __future__ import annotations

import itertools
import time

from dsec.actuators.sampler import SamplerGate
from dsec.experiment.rollout_sampler import RolloutSampler
from dsec.schemas import ActuationStatus
from dsec.schemas.actuations import SamplerParams

SAFETY_S = 30.0


def _until(condition, timeout_s: float = SAFETY_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_one_rollout_per_request_and_a_pause_parks_the_thread_until_resumed() -> None:
    gate = SamplerGate()
    counter = itertools.count()
    errors: list[BaseException] = []
    sampler = RolloutSampler(lambda: next(counter), gate, errors.append).start()
    try:
        assert sampler.take(0.1) is None  # nothing asked for, nothing collected
        sampler.request()
        assert sampler.take(SAFETY_S) == 0
        assert sampler.take(0.1) is None  # one rollout per request
        pause = gate.apply(SamplerParams(paused=True))  # the thread has registered
        sampler.request()
        _until(lambda: sampler.parked)
        effect = _until(pause.settle)
        assert (effect.status, effect.in_force) == (ActuationStatus.APPLIED, "true")
        assert sampler.take(0.2) is None  # paused: nothing collected
        resume = gate.apply(SamplerParams(paused=False))
        assert sampler.take(SAFETY_S) == 1 and not sampler.parked
        assert _until(resume.settle).in_force == "false"
    finally:
        sampler.stop()
    assert errors == []


def test_a_discarded_request_is_not_collected_and_a_failure_is_handed_on() -> None:
    gate = SamplerGate()
    errors: list[BaseException] = []

    def collect() -> int:
        raise RuntimeError("the environment broke")

    sampler = RolloutSampler(collect, gate, errors.append).start()
    try:
        gate.apply(SamplerParams(paused=True))
        sampler.request()
        _until(lambda: sampler.parked)
        sampler.discard()
        gate.apply(SamplerParams(paused=False))
        time.sleep(0.2)
        assert errors == []  # nothing asked for any more: nothing collected
        sampler.request()
        _until(lambda: errors)
        assert "the environment broke" in str(errors[0])
    finally:
        sampler.stop()
