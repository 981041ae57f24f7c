"""``dsec bench reaction`` on the real broker: stream jobs, policy engine, node actuator and a
worker, each in its own process; every trial's command is applied inside the worker."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsec.bench.reaction_figures import STAGES
from dsec.cli import app

pytestmark = pytest.mark.integration

SUMMARY_KEYS = {"count", "min_ms", "p50_ms", "p99_ms", "max_ms", "mean_ms"}


@pytest.mark.timeout(240)
def test_every_trial_is_applied_in_the_worker_and_timed_by_stage(kafka_bootstrap) -> None:
    result = CliRunner().invoke(app, ["bench", "reaction", "--json", "--trials", "3",
                                      "--bootstrap", kafka_bootstrap])
    assert result.exit_code == 0, result.output[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["trials"], out["applied"], out["missed"]) == (3, 3, 0)
    assert len(out["latencies_ms"]) == 3
    for key in ("p50_ms", "p99_ms", "min_ms", "max_ms", "mean_ms"):
        assert isinstance(out[key], float)
    assert out["min_ms"] <= out["p50_ms"] <= out["p99_ms"] <= out["max_ms"]
    assert out["recorded_to_applied_ms"].keys() == SUMMARY_KEYS
    # every message between the NaN step and the apply hook was found on its topic
    assert set(out["stages_ms"]) == set(STAGES)
    assert all(stage["count"] == 3 for stage in out["stages_ms"].values())
    assert out["policy"] == "precision-downgrade"
