"""A three-node Kafka cluster under steady probe load: the leader of the metrics partitions,
then the active controller, then the stream-job process SIGKILLed and each restarted
(``dsec bench faults``, at a small load). No acknowledged sample is lost and none is
stored twice. Runs a few minutes: three Kafka JVMs and three services start first."""

from __future__ import annotations

import pytest

from dsec.bench.faults import FaultsOptions, run_faults_bench

pytestmark = pytest.mark.integration


def test_kills_of_a_leader_the_controller_and_a_stream_job_lose_and_double_nothing() -> None:
    result = run_faults_bench(FaultsOptions(workers=4, warmup_s=5.0, settle_s=2.0),
                              say=print)
    print(result)
    assert result["batches_failed"] == 0
    assert result["samples_sent"] > 0
    assert result["samples_lost"] == 0
    assert result["samples_doubled"] == 0
    assert result["samples_stored"] == result["samples_sent"]
    faults = result["faults"]
    assert [f["fault"].split()[-1] for f in faults] == ["partitions", "controller", "process"]
    assert all(f["recovery_s"] >= 0 for f in faults)
    # the controller's kill elected another node
    assert faults[1]["new_controller"] not in (None, faults[1]["node"])
