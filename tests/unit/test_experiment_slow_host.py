"""Speed independence: a slower host, and a scenario stretched to last as many steps."""

from __future__ import annotations

import time

import pytest

from dsec.experiment.faults import fault_schedule, load_scenario, scale_scenario
from dsec.experiment.slow_host import SlowHost


def test_a_slow_host_stretches_cpu_work_and_not_waiting() -> None:
    def spin(seconds: float) -> None:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass

    started = time.perf_counter()
    with SlowHost(3.0).stretch():
        spin(0.05)
        time.sleep(0.05)  # waiting (a kernel, a peer) is not CPU work: not stretched
    elapsed = time.perf_counter() - started
    assert 0.2 <= elapsed < 0.6
    started = time.perf_counter()
    with SlowHost(1.0).stretch():
        time.sleep(0.01)
    assert time.perf_counter() - started < 0.2


def test_a_scaled_scenario_puts_the_same_faults_at_stretched_times() -> None:
    scenario = load_scenario("bad-night-2")
    scaled = scale_scenario(scenario, 3.0)
    assert scaled.sim_hour_s == 30.0 and scaled.snapshot_interval_s == 27.0
    assert scaled.collective_timeout_s == 60.0
    assert scaled.faults.flaky_card.fail_after_s == 30.0
    assert scaled.restart_delay_s == scenario.restart_delay_s
    assert scale_scenario(scenario, 1.0) is scenario
    base = fault_schedule(scenario, 8, 150.0, seed=1)
    stretched = fault_schedule(scaled, 8, 450.0, seed=1)
    assert [(e.kind, e.worker) for e in stretched] == [(e.kind, e.worker) for e in base]
    for fast, slow in zip(base, stretched, strict=True):
        assert slow.start_s == pytest.approx(3.0 * fast.start_s)
        assert slow.end_s - slow.start_s == pytest.approx(3.0 * (fast.end_s - fast.start_s))
