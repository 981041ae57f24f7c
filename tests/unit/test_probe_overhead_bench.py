"""The overhead benchmark's arithmetic and wiring (no timing thresholds here)."""

from __future__ import annotations

import statistics

import pytest

from dsec.bench.probe_overhead import block_summary, median_ci95, reference_model


def test_block_summary_takes_the_median_paired_difference() -> None:
    # the third pair met a slow moment of the machine on its off side: it does not count
    summary = block_summary(off_ms=[2.0, 2.0, 9.0], on_ms=[2.02, 2.01, 2.0])
    assert summary["step_ms_off"] == 2.0 and summary["step_ms_on"] == pytest.approx(2.01)
    assert summary["overhead_ratio"] == pytest.approx(1.005)
    assert summary["ratio_of_medians"] == pytest.approx(1.005)


def test_drift_shared_by_both_sides_cancels_in_pairs() -> None:
    off = [2.0 + 0.01 * i for i in range(100)]  # the machine slows down through the run
    on = [value + 0.004 for value in off]
    summary = block_summary(off_ms=off, on_ms=on)
    assert summary["overhead_ratio"] == pytest.approx(1 + 0.004 / statistics.median(off), abs=1e-4)
    low, high = summary["overhead_ratio_ci95"]
    assert low == pytest.approx(high) == pytest.approx(summary["overhead_ratio"])


def test_the_median_interval_holds_the_middle_order_statistics() -> None:
    assert median_ci95(list(range(100))) == (40, 59)  # k = floor(50 - 9.8) = 40
    assert median_ci95([1.0]) == (1.0, 1.0)


def test_reference_model_has_about_100k_parameters() -> None:
    assert 90_000 <= sum(p.numel() for p in reference_model().parameters()) <= 110_000


def test_command_is_registered() -> None:
    from typer.testing import CliRunner

    from dsec.cli import app

    result = CliRunner().invoke(app, ["bench", "probe-overhead", "--help"])
    assert result.exit_code == 0 and "--json" in result.output
