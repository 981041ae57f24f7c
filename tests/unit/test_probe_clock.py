"""The probe's clock seam: the system's clocks as they are, and a manual one tests move."""

from __future__ import annotations

import time

import pytest

from dsec.ingest.clock import ManualClock, SystemClock


def test_the_system_clock_is_the_c_functions_themselves() -> None:
    clock = SystemClock()
    assert clock.monotonic_s is time.perf_counter  # no call of ours on the training thread
    before_ms = time.time_ns() // 1_000_000
    assert before_ms <= clock.now_ms() <= time.time_ns() // 1_000_000


def test_a_manual_clock_moves_both_readings_together_and_only_forwards() -> None:
    clock = ManualClock(start_s=10.0, start_ms=1_700_000_000_000)
    assert (clock.monotonic_s(), clock.now_ms()) == (10.0, 1_700_000_000_000)
    clock.advance(0.25)
    assert (clock.monotonic_s(), clock.now_ms()) == (10.25, 1_700_000_000_250)
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    assert clock.monotonic_s() == 10.25
