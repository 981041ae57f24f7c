"""A cluster node's broker settings and the replication of the topics dsec makes, without a
broker: the three-node cluster itself runs in tests/integration/test_faults_kafka.py."""

from __future__ import annotations

from pathlib import Path

from dsec.infra.kafka_local import LocalKafka
from dsec.infra.topics import min_insync_replicas


def _properties(broker: LocalKafka) -> dict[str, str]:
    broker.data_dir.mkdir(parents=True, exist_ok=True)
    lines = broker._write_config().read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_a_single_broker_keeps_its_own_quorum_on_loopback(tmp_path: Path) -> None:
    props = _properties(LocalKafka(tmp_path, port=9100, controller_port=9101))
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9100"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"


def test_a_cluster_node_votes_with_the_others_and_replicates_internal_topics(
    tmp_path: Path,
) -> None:
    voters = "1@127.0.0.1:9201,2@127.0.0.1:9202,3@127.0.0.1:9203"
    props = _properties(LocalKafka(tmp_path, port=9102, controller_port=9202, node_id=2,
                                   quorum_voters=voters, internal_replicas=3))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == voters
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"


def test_a_broker_for_a_network_namespace_listens_where_the_namespace_reaches_it(
    tmp_path: Path,
) -> None:
    props = _properties(LocalKafka(tmp_path, port=9100, controller_port=9101,
                                   host="10.77.0.1"))
    assert props["listeners"].startswith("PLAINTEXT://10.77.0.1:9100,")
    assert props["advertised.listeners"] == "PLAINTEXT://10.77.0.1:9100"


def test_min_insync_replicas_leave_one_replica_to_lose() -> None:
    assert [min_insync_replicas(n) for n in (1, 2, 3, 5)] == [1, 1, 2, 2]
