"""The faults of an experiment worker's schedule, on an injected run clock."""

from __future__ import annotations

import math

import numpy as np

from dsec.experiment.faults import FaultEvent
from dsec.experiment.worker_faults import HEALTHY_LINK_BYTES_PER_S, ScheduledFaults, wire_bytes

PARAMS = {"nan_burst": {"spike_factor": 50.0, "burst_steps": 2},
          "sync_jitter": {"degraded_bytes_per_s": 1e8, "jitter_ms": 0.0}}


def _faults(events: list[FaultEvent], clock: list[float]) -> ScheduledFaults:
    return ScheduledFaults(events, PARAMS, lambda: clock[0], np.random.default_rng(0))


def test_a_stall_costs_its_length_once() -> None:
    clock = [5.0]
    faults = _faults([FaultEvent("sync_stall", 0, 4.0, 7.0)], clock)
    healthy_s = wire_bytes(32) / HEALTHY_LINK_BYTES_PER_S
    assert math.isclose(faults.link_s(32), healthy_s + 3.0)
    assert math.isclose(faults.link_s(32), healthy_s)


def test_a_nan_burst_spikes_then_gives_nan_for_its_steps() -> None:
    clock = [1.0]
    faults = _faults([FaultEvent("nan_burst", 0, 1.0, 2.0)], clock)
    assert {faults.loss_factor() for _ in range(20)} == {1.0, 50.0}
    clock[0] = 2.5
    assert [math.isnan(faults.loss_factor()) for _ in range(3)] == [True, True, False]


def test_a_crash_is_due_from_its_start_and_compression_shrinks_the_wire() -> None:
    clock = [0.0]
    faults = _faults([FaultEvent("crash", 0, 3.0, 3.0)], clock)
    assert not faults.crash_due()
    clock[0] = 3.0
    assert faults.crash_due()
    assert wire_bytes(32) == 4 * wire_bytes(8) == 8 * wire_bytes(4)


def test_a_nan_burst_without_precursor_strikes_at_once() -> None:
    clock = [3.0]
    faults = _faults([FaultEvent("nan_burst", 0, 3.0, 3.0)], clock)
    assert math.isnan(faults.loss_factor())


def test_a_straggler_slows_the_card_while_it_lasts_and_a_hang_never_ends() -> None:
    clock = [0.0]
    faults = ScheduledFaults([FaultEvent("straggler", 0, 1.0, 5.0),
                              FaultEvent("silent_hang", 0, 8.0, 8.0)],
                             {"straggler": {"slowdown": 3.0}}, lambda: clock[0],
                             np.random.default_rng(0))
    assert faults.slowdown() == 1.0 and not faults.hang_due()
    clock[0] = 2.0
    assert faults.slowdown() == 3.0
    clock[0] = 9.0
    assert faults.slowdown() == 1.0 and faults.hang_due()


def test_a_flaky_card_fails_every_worker_started_on_it_while_the_fault_lasts() -> None:
    clock = [0.0]
    faults = ScheduledFaults([FaultEvent("flaky_card", 0, 10.0, 60.0)],
                             {"flaky_card": {"fail_after_s": 5.0}}, lambda: clock[0],
                             np.random.default_rng(0))
    clock[0] = 14.0
    assert not faults.card_failure_due(born_s=0.0)
    clock[0] = 15.0
    assert faults.card_failure_due(born_s=0.0)
    # a replacement started at 20 s on the same card lasts 5 s too
    clock[0] = 22.0
    assert not faults.card_failure_due(born_s=20.0)
    clock[0] = 25.0
    assert faults.card_failure_due(born_s=20.0)
    clock[0] = 70.0  # the card is healthy again
    assert not faults.card_failure_due(born_s=20.0)
