"""``dsec bench detection`` at a smoke setting on the real broker: one tuning shape, six
workers, 75 s of faults after two minutes of history, through the whole stack. The
variance jump's test needs returns after its onset (22.5 s in): whatever the replay's
drain time, the stages see it at most 31 s after the onset (offline), 20 s before the end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsec.cli import app

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_the_smoke_run_detects_every_fault_and_spares_the_healthy(kafka_bootstrap) -> None:
    result = CliRunner().invoke(app, [
        "bench", "detection", "--shapes", "atari", "--seeds", "1", "--workers", "6",
        "--duration-s", "75", "--preroll-s", "120", "--bootstrap", kafka_bootstrap, "--json"])
    assert result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out["classes"]) == {"memory_leak", "stuck_episode", "card_degraded",
                                   "nan_burst", "variance_jump"}
    overall = out["overall"]
    assert overall["targets"] == 6 and overall["recall"] == 1.0, out["missed"]
    assert overall["precision"] >= 0.8, out["false_firings"]
    assert out["corrective_commands_on_healthy_workers"] <= 1, out["false_firings"]
    assert out["traces"][0]["held_out"] is False and out["tuned_on"]["shapes"] == [
        "atari", "mujoco"]
    assert out["messages_published"] >= 6 * 75
