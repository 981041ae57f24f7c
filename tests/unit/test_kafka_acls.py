"""Least privilege on Kafka as dsec defines it: who may write and read which topic, and
the chart's values holding the same ACLs (on a real broker: test_trust_kafka.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from dsec.infra.kafka_acls import CONSUME, PRODUCE, dsec_users, helm_acls, strimzi_users
from dsec.placement.topic_history import GROUP_PREFIX, history_topics
from dsec.schemas import topic_names

CHART = Path(__file__).parents[2] / "infra" / "helm" / "dsec"


def _who(operation: str, topic: str) -> set[str]:
    return {user.role for user in dsec_users("p").values() for acl in user.acls
            if acl.resource == "topic" and acl.pattern == "literal" and acl.name == topic
            and operation in acl.operations}


def test_who_writes_and_reads_what() -> None:
    t = topic_names("p")
    assert _who("Write", t.actuations) == {"policy-engine"}  # only the engine commands
    assert _who("Write", t.policies) == {"publisher", "policy-engine"}  # + tuned versions
    assert _who("Write", t.pools) == {"publisher", "policy-engine"}
    assert _who("Write", t.metrics) == {"worker", "gateway"}
    assert _who("Read", t.actuations) == {"worker", "node-actuator", "gateway", "sink"}
    assert _who("Write", t.actuation_results) == {"node-actuator", "gateway"}
    worker = dsec_users("p")["worker"]
    assert [(a.name, a.operations) for a in worker.acls if a.resource == "topic"] == [
        (t.metrics, PRODUCE), (t.actuations, CONSUME)]
    assert all(a.resource != "cluster" for u in dsec_users("p").values() for a in u.acls)


def test_every_topic_has_a_writer_and_a_reader() -> None:
    """A topic no user may write is a job that crashes on its first output."""
    for field, topic in dataclasses.asdict(topic_names("p")).items():
        assert _who("Write", topic), field
        assert _who("Read", topic), field
    t = topic_names("p")
    assert _who("Write", t.gpu_cards) == _who("Read", t.gpu_cards) == {"stream-jobs"}


def test_the_placement_history_reader_is_in_a_group_the_placement_user_may_read() -> None:
    placement = dsec_users("p")["placement"]
    assert any(acl.resource == "group" and acl.pattern == "prefix" and "Read" in acl.operations
               and f"{GROUP_PREFIX}-0a1b2c3d".startswith(acl.name) for acl in placement.acls)


def test_the_placement_user_may_read_every_topic_of_the_placement_history() -> None:
    for topic in history_topics(topic_names("p")):
        assert "placement" in _who("Read", topic), topic


def test_chart_values_hold_the_same_acls() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["kafka"]["users"]["acls"] == helm_acls()


def test_strimzi_users_are_scram_with_simple_acls() -> None:
    users = strimzi_users("rl", "training-kafka")
    assert {u["metadata"]["name"] for u in users} == {
        f"dsec-{role}" for role in dsec_users()}
    for user in users:
        assert (user["apiVersion"], user["kind"]) == ("kafka.strimzi.io/v1beta2", "KafkaUser")
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "training-kafka"
        spec = user["spec"]
        assert spec["authentication"] == {"type": "scram-sha-512"}
        assert spec["authorization"]["type"] == "simple"
        for acl in spec["authorization"]["acls"]:
            assert acl["resource"]["type"] in {"topic", "group"}
            assert acl["resource"]["patternType"] in {"literal", "prefix"}
            assert set(acl["operations"]) <= {"Read", "Write", "Describe", "Create",
                                              "DescribeConfigs"}
            assert acl["resource"]["name"].startswith(("rl.", "rl-", "dsec-"))
