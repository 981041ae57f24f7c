"""The overhead benchmark's arithmetic and wiring (no timing thresholds here)."""

from __future__ import annotations

import pytest

from dsec.bench.probe_overhead import block_summary, reference_model


def test_block_summary_uses_medians_and_pairs() -> None:
    summary = block_summary(off_ms=[2.0, 2.0, 9.0], on_ms=[2.02, 2.01, 2.0])
    assert summary["step_ms_off"] == 2.0 and summary["step_ms_on"] == pytest.approx(2.01)
    assert summary["overhead_ratio"] == pytest.approx(1.005)
    assert summary["paired_ratio_median"] == pytest.approx(1.005)


def test_reference_model_has_about_100k_parameters() -> None:
    assert 90_000 <= sum(p.numel() for p in reference_model().parameters()) <= 110_000


def test_command_is_registered() -> None:
    from typer.testing import CliRunner

    from dsec.cli import app

    result = CliRunner().invoke(app, ["bench", "probe-overhead", "--help"])
    assert result.exit_code == 0 and "--json" in result.output
