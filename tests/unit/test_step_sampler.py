"""The training thread's part on its own: which steps become samples, what they hold,
and when the step callbacks run, on a clock the test moves."""

from __future__ import annotations

import pytest
import torch

from dsec.ingest.clock import ManualClock
from dsec.ingest.config import ProbeConfig
from dsec.ingest.step_sampler import StepSampler
from dsec.schemas.metrics import MICRO_STEP


class Harness:
    def __init__(self, **config: object) -> None:
        self.samples: list[tuple] = []
        self.flushes_asked = 0
        self.callback_runs = 0
        self.clock = ManualClock()
        self.sampler = StepSampler(ProbeConfig(**config), self.samples.append, self.clock,
                                   self._flush_soon, self._run_callbacks)

    def _flush_soon(self) -> None:
        self.flushes_asked += 1

    def _run_callbacks(self) -> None:
        self.callback_runs += 1

    def steps(self) -> list[tuple]:
        return [sample for sample in self.samples if sample[0] == "step"]


def test_steps_between_samples_only_count() -> None:
    harness = Harness(step_sample_every_n_steps=4, grad_norm_every_n_steps=100)
    sampler = harness.sampler
    for _ in range(9):
        harness.clock.advance(0.002)
        sampler.record_step(loss=0.5)
    assert sampler.global_step == 9
    assert [s[2] for s in harness.steps()] == [0, 4, 8]
    assert sampler.fast_until_step == 12  # the next one due
    (_kind, event_time_ms, _step, loss, _norm, step_time_ms, _source) = harness.steps()[1]
    assert loss == 0.5 and step_time_ms == pytest.approx(2.0)  # the mean since the previous sample
    assert event_time_ms == 1_700_000_000_000 + 10  # on the clock: 5 steps of 2 ms
    assert harness.flushes_asked == 0  # routine samples wait for the flush interval


def test_a_nonfinite_number_makes_a_sample_and_asks_for_a_flush_now() -> None:
    harness = Harness(step_sample_every_n_steps=10, grad_norm_every_n_steps=10)
    sampler = harness.sampler
    sampler.record_step(loss=0.5)
    sampler.note_loss(float("nan"))  # noted first, as a watched loop does
    sampler.record_step()
    sampler.record_step(loss=torch.tensor(float("nan")))  # a tensor is not read here
    assert [s[2] for s in harness.steps()] == [0, 1] and harness.flushes_asked == 1


def test_a_trainer_norm_is_kept_only_on_a_step_due_for_a_sample() -> None:
    harness = Harness(step_sample_every_n_steps=2, grad_norm_every_n_steps=2)
    sampler = harness.sampler
    for step in range(3):
        sampler.note_grad_norm(float(step + 1))
        sampler.record_step()
    assert [(s[2], s[4], s[6]) for s in harness.steps()] == [(0, 1.0, "trainer"),
                                                            (2, 3.0, "trainer")]


def test_a_wake_runs_the_callbacks_at_the_next_boundary_once() -> None:
    harness = Harness(step_sample_every_n_steps=100, grad_norm_every_n_steps=100)
    sampler = harness.sampler
    sampler.record_step()
    sampler.record_step()
    assert harness.callback_runs == 0
    sampler.wake()
    assert sampler.fast_until_step == 0
    sampler.record_step()
    sampler.record_step()
    assert harness.callback_runs == 1
    sampler.wake()
    sampler.record_episode(1.0, 3)
    assert harness.callback_runs == 2
    assert harness.samples[-1][0] == "episode"


def test_queued_losses_are_read_by_the_flusher_and_bad_ones_become_samples() -> None:
    harness = Harness(step_sample_every_n_steps=10, grad_norm_every_n_steps=10,
                      loss_check_every_step=True)
    sampler = harness.sampler
    for step in range(5):
        sampler.record_step(loss=torch.tensor(float("inf") if step == 3 else 0.5))
    assert [s[2] for s in harness.steps()] == [0]
    sampler.check_losses()
    sampler.check_losses()  # each loss is read once
    assert [s[2] for s in harness.steps()] == [0, 3]


def test_micro_step_norms_stand_for_the_step_norm() -> None:
    harness = Harness(step_sample_every_n_steps=1, grad_norm_every_n_steps=1)
    sampler = harness.sampler
    sampler.norms_per_micro_step = True
    sampler.record_micro_step_norm(torch.tensor(2.0))
    sampler.record_micro_step_norm(torch.tensor(float("nan")))
    sampler.note_grad_norm(5.0)  # not mixed in
    sampler.record_step(grad_norm=None)
    micro, bad, step = harness.steps()
    assert micro[4] == 2.0 and micro[6] == MICRO_STEP and bad[6] == MICRO_STEP
    assert step[4] is None and harness.flushes_asked == 1
