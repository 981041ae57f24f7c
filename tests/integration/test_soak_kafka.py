"""The soak (``dsec bench soak``) in short: a few hundred synthetic workers at real probe
rates through the sink, stream jobs, policy engine and two node actuators for 45 s, on the
session broker. Nothing the broker acknowledged is lost or stored twice, and the timeline
has every service's memory and every group's lag. The ten-minute, 1,000-worker run is
``dsec bench soak --workers 1000 --duration-s 600 --json`` (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from dsec.bench.soak import SoakOptions, run_soak

pytestmark = pytest.mark.integration


def test_a_short_soak_loses_and_doubles_nothing(kafka_bootstrap: str) -> None:
    result = run_soak(SoakOptions(workers=200, duration_s=45.0, load_processes=2,
                                  actuator_nodes=2, sample_interval_s=5.0,
                                  bootstrap=kafka_bootstrap), say=print)
    print({k: v for k, v in result.items() if k != "timeline"})
    assert result["batches_failed"] == 0
    assert result["samples_in"] > 0
    assert result["samples_stored"] == result["samples_in"]
    assert result["samples_lost"] == 0
    assert result["samples_doubled"] == 0
    assert result["commands_emitted"] > 0
    last = result["timeline"][-1]
    assert {"sink", "stream-jobs", "policy-engine", "node-actuator"} <= set(last["rss_mib"])
    assert all(last["rss_mib"][name] for name in ("sink", "stream-jobs", "policy-engine"))
    assert set(last["lag_messages"]) == {"sink", "stream-jobs", "policy-engine"}
