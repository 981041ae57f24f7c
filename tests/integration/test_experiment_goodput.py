"""``dsec experiment goodput`` on the real broker: two small arms, side by side."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsec.cli import app

pytestmark = pytest.mark.integration

ARM_KEYS = {"interruptions", "recovery_mean_s", "recovery_p95_s",
            "effective_training_time_ratio", "steps", "gpu_utilisation", "final_mean_return"}


@pytest.mark.timeout(240)
def test_goodput_runs_both_arms_and_only_the_dsec_arm_acts(kafka_bootstrap, tmp_path) -> None:
    report = tmp_path / "goodput.html"
    result = CliRunner().invoke(app, [
        "experiment", "goodput", "--scenario", "smoke", "--workers", "2", "--duration-s", "40",
        "--bootstrap", kafka_bootstrap, "--run-dir", str(tmp_path / "run"), "--json",
        "--report", str(report)])
    assert result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    baseline, acting = out["baseline"], out["dsec"]
    assert baseline.keys() >= ARM_KEYS and acting.keys() >= ARM_KEYS
    assert baseline["steps"] > 0 and acting["steps"] > 0
    # The baseline's policies only dry-ran: decisions recorded, nothing applied.
    assert baseline["actions"] == {}
    assert any(name.endswith(":dry_run") for name in baseline["policy_decisions"])
    assert not any(name.endswith(":fired") for name in baseline["policy_decisions"])
    # The dsec arm acted: snapshots at least, and the leaking card was capped, not lost.
    assert acting["actions"].get("snapshot", 0) > 0
    assert any(name.endswith(":fired") for name in acting["policy_decisions"])
    assert "oom" not in acting["causes"]
    assert "<svg" in report.read_text()
