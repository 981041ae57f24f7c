"""``dsec experiment goodput`` on the real broker: three small arms, side by side."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsec.cli import app

pytestmark = pytest.mark.integration

ARM_KEYS = {"interruptions", "recovery_mean_s", "recovery_p95_s", "unrecovered",
            "effective_training_time_ratio", "steps", "gpu_utilisation", "final_mean_return",
            "steps_per_s", "return_auc", "degraded_ratio", "degraded_s"}


@pytest.mark.timeout(720)  # three arms starting on a shared 2-core host
def test_goodput_runs_three_arms_and_only_the_dsec_arm_acts(kafka_bootstrap, tmp_path) -> None:
    report = tmp_path / "goodput.html"
    result = CliRunner().invoke(app, [
        "experiment", "goodput", "--scenario", "smoke", "--workers", "2", "--duration-s", "40",
        "--bootstrap", kafka_bootstrap, "--run-dir", str(tmp_path / "run"), "--json",
        "--report", str(report)])
    assert result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out) >= {"plain", "strong", "dsec", "run"}
    acting = out["dsec"]
    for observing in (out["plain"], out["strong"]):
        assert observing.keys() >= ARM_KEYS
        # Work was done; what survives it may be nothing in the plain arm (no checkpoint
        # yet when the leaking worker's OOM rolls the whole group back to the start).
        assert observing["steps_per_s"] > 0
        # The observing arms' policies only dry-ran: decisions recorded, nothing applied.
        assert observing["actions"] == {}
        assert any(name.endswith(":dry_run") for name in observing["policy_decisions"])
        assert not any(name.endswith(":fired") for name in observing["policy_decisions"])
    assert acting.keys() >= ARM_KEYS and acting["steps"] > 0
    assert out["run"]["time_scale"] == 1.0 and out["run"]["calibration_update_s"] > 0
    # The dsec arm acted: snapshots at least, and the leaking card was capped, not lost.
    assert acting["actions"].get("snapshot", 0) > 0
    assert any(name.endswith(":fired") for name in acting["policy_decisions"])
    assert "oom" not in acting["causes"]
    page = report.read_text()
    assert "<svg" in page and "<th>strong</th>" in page


@pytest.mark.timeout(600)
def test_goodput_placement_moves_a_restarted_worker_off_the_leaky_model(
        kafka_bootstrap, tmp_path) -> None:
    """One arm, placement on: the worker that starts on the leaky model's card OOMs, and the
    restarter, asking the recommendation API, brings it back on a card of the other model."""
    result = CliRunner().invoke(app, [
        "experiment", "goodput", "--scenario", "leaky-model", "--workers", "2",
        "--duration-s", "60", "--arms", "dsec", "--placement", "on",
        "--bootstrap", kafka_bootstrap, "--run-dir", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out) == {"dsec", "run"} and out["run"]["placement"] is True
    placed = out["dsec"]["placement"]
    assert out["dsec"]["causes"].get("oom", 0) >= 1
    assert placed["restarts"] >= 1 and placed["restarts_on_leaky_model"] == 0
    assert all(move["error"] is None for move in placed["moves"])
    assert placed["moved"] >= 1
