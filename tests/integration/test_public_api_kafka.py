"""The public surface, guarded: a rename here is a breaking change for training scripts."""

from __future__ import annotations

import dsec


def test_the_node_id_comes_from_the_environment_when_not_given(
    monkeypatch, kafka_bootstrap: str
) -> None:

    monkeypatch.setenv("DSEC_NODE_ID", "gpu-node-17")
    monkeypatch.setenv("DSEC_ACTUATOR_CHANNEL", "kafka")
    from dsec.ingest import ProbeConfig

    runtime = dsec.init(kafka_bootstrap, worker_id="w0", actuate=False,
                        probe_config=ProbeConfig(shutdown_flush_timeout_s=0))
    try:
        assert runtime.identity.node_id == "gpu-node-17"
    finally:
        dsec.shutdown()


def test_the_pool_and_labels_come_from_the_arguments_or_the_environment(
    monkeypatch, kafka_bootstrap: str
) -> None:
    monkeypatch.setenv("DSEC_POOL", "h100-pool")
    monkeypatch.setenv("DSEC_LABELS", '{"rack": "r7"}')
    monkeypatch.setenv("DSEC_ACTUATOR_CHANNEL", "kafka")
    from dsec.ingest import ProbeConfig

    config = ProbeConfig(shutdown_flush_timeout_s=0)
    runtime = dsec.init(kafka_bootstrap, worker_id="w0", actuate=False, probe_config=config)
    try:
        assert (runtime.identity.pool, runtime.identity.labels) == ("h100-pool", {"rack": "r7"})
    finally:
        dsec.shutdown()
    runtime = dsec.init(kafka_bootstrap, worker_id="w0", pool="a100-pool", actuate=False,
                        probe_config=config)
    try:
        assert runtime.identity.pool == "a100-pool"
    finally:
        dsec.shutdown()
