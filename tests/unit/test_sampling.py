"""How often the probe takes a gradient norm: the pure spacing rule, and the probe following it."""

from __future__ import annotations

import pytest
import torch
from recording import RecordingTransport, manual_probe

from dsec.ingest.clock import ManualClock
from dsec.ingest.sampling import SpacedWork, budget_interval_steps, smoothed


def test_norms_are_spaced_to_keep_their_cost_within_the_budget() -> None:
    # 300 us a norm on 3 ms steps, 0.2 % budget: every 50 steps costs exactly 0.2 %
    assert budget_interval_steps(300e-6, 3e-3, 0.002, 100) == 50
    assert budget_interval_steps(301e-6, 3e-3, 0.002, 100) == 51  # never over the budget
    # a GPU step of 50 ms, a 40 us launch: every step
    assert budget_interval_steps(40e-6, 50e-3, 0.002, 100) == 1
    assert budget_interval_steps(1.0, 1e-3, 0.002, 100) == 100  # at least every max steps


@pytest.mark.parametrize("cost_s, step_s, budget", [(0.0, 1e-3, 0.01), (1e-4, 0.0, 0.01),
                                                    (1e-4, 1e-3, 0.0), (float("nan"), 1, 1)])
def test_unknown_costs_mean_every_step(cost_s: float, step_s: float, budget: float) -> None:
    assert budget_interval_steps(cost_s, step_s, budget, 100) == 1


def test_smoothing_starts_at_the_first_value_and_follows() -> None:
    assert smoothed(None, 4.0) == 4.0
    assert smoothed(4.0, 9.0, weight=0.2) == pytest.approx(5.0)


def _train(probe, steps: int, step_s: float, clock: ManualClock) -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe.watch(optimizer)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        clock.advance(step_s)
        optimizer.step()


def test_a_costly_norm_is_taken_less_often_and_a_cheap_one_more(monkeypatch) -> None:
    """Steps and norms take exactly as long as the test says, on a clock only it moves,
    however loaded the machine is."""
    clock = ManualClock()

    def slow_norm(optimizer):
        clock.advance(0.004)
        return torch.tensor(1.0)

    monkeypatch.setattr("dsec.ingest.optimizer_hooks.total_grad_norm", slow_norm)
    transport = RecordingTransport()
    probe = manual_probe(transport, clock, step_sample_every_n_steps=1000,
                         grad_norm_budget_fraction=0.05, grad_norm_max_interval_steps=30)
    assert probe.grad_norm_interval_steps == 10  # until measured
    _train(probe, 200, 0.001, clock)
    probe.flush()
    normed = [s.step for s in transport.samples("step") if s.grad_norm is not None]
    # 4 ms against ~1 ms steps within 5 %: one norm in ~80 steps, held to one in 30
    assert probe.grad_norm_interval_steps == 30
    assert normed[:3] == [0, 10, 20] and normed[-1] - normed[-2] == 30

    def quick_norm(optimizer):
        clock.advance(2e-6)
        return torch.tensor(1.0)

    monkeypatch.setattr("dsec.ingest.optimizer_hooks.total_grad_norm", quick_norm)
    cheap = manual_probe(RecordingTransport(), clock, step_sample_every_n_steps=1000,
                         grad_norm_budget_fraction=0.05)
    _train(cheap, 60, 0.002, clock)
    assert cheap.grad_norm_interval_steps == 1  # microseconds against 2 ms steps


def test_a_set_interval_is_kept_whatever_the_norm_costs(monkeypatch) -> None:
    monkeypatch.setattr("dsec.ingest.sampling.budget_interval_steps",
                        lambda *args: pytest.fail("a set interval is not respaced"))
    transport = RecordingTransport()
    clock = ManualClock()
    probe = manual_probe(transport, clock, step_sample_every_n_steps=1000,
                         grad_norm_every_n_steps=3)
    _train(probe, 10, 0.001, clock)
    probe.flush()
    assert [s.step for s in transport.samples("step")] == [0, 3, 6, 9]
    assert probe.grad_norm_interval_steps == 3


class SlowSampleClock(ManualClock):
    """Every event time read costs 4 ms: a step sample reads one."""

    def now_ms(self) -> int:
        self.advance(0.004)
        return super().now_ms()


def test_a_costly_step_sample_is_taken_less_often() -> None:
    clock = SlowSampleClock()
    transport = RecordingTransport()
    probe = manual_probe(transport, clock, step_sample_every_n_steps=None,
                         step_sample_budget_fraction=0.05, step_sample_max_interval_steps=30,
                         grad_norm_every_n_steps=1000)
    assert probe.step_sample_interval_steps == 10  # until measured
    for _ in range(200):
        clock.advance(0.001)
        probe.record_step()
    probe.flush()
    sampled = [s.step for s in transport.samples("step")]
    # 4 ms a sample against ~1 ms steps within 5 %: one in ~80 steps, held to one in 30
    assert probe.step_sample_interval_steps == 30
    assert sampled[:3] == [0, 10, 20] and sampled[-1] - sampled[-2] == 30


def test_spaced_work_follows_its_cost_and_keeps_a_set_interval() -> None:
    work = SpacedWork(budget_fraction=0.01, max_interval_steps=100)
    assert work.interval_steps == 10  # until measured
    work.took(5.0, step_time_s=0.001)  # the first call: not counted
    assert work.interval_steps == 10 and work.cost_s is None
    work.took(50e-6, step_time_s=0.001)  # 50 us against 1 ms steps within 1 %: every 5
    assert work.interval_steps == 5
    fixed = SpacedWork(budget_fraction=0.01, max_interval_steps=100, fixed_interval_steps=3)
    fixed.took(1.0, 0.001)
    fixed.took(1.0, 0.001)
    assert fixed.interval_steps == 3
