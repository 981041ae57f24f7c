"""Least privilege on Kafka: the SCRAM user each part of dsec runs as, and the ACLs it
needs and no more, derived from the topic prefix. Applied to a broker with the Admin API
(``apply_acls``), rendered for Strimzi as ``KafkaUser`` objects (``strimzi_users``) and
for the Helm chart's values (``helm_acls``), so the three never drift apart.

Kafka authorizes per topic, and commands for every node share one topic keyed by node:
a worker's user may read the whole commands topic, and what keeps one worker from acting
on another's commands is the signature (only the engine's key signs a command) and the
target check at the gate, not the ACL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from dsec.schemas.topics import TopicNames, topic_names

ResourceType = Literal["topic", "group", "cluster"]
Pattern = Literal["literal", "prefix"]
# Kafka's operation names, as Strimzi spells them
READ, WRITE, DESCRIBE, CREATE = "Read", "Write", "Describe", "Create"
DESCRIBE_CONFIGS, ALTER_CONFIGS = "DescribeConfigs", "AlterConfigs"
PRODUCE = (WRITE, DESCRIBE)
CONSUME = (READ, DESCRIBE)
# A Faust app's own topics (table changelogs, its assignor's) and consumer group
FAUST_APP = (READ, WRITE, DESCRIBE, CREATE, DESCRIBE_CONFIGS)


@dataclass(frozen=True)
class Acl:
    resource: ResourceType
    name: str
    pattern: Pattern
    operations: tuple[str, ...]


@dataclass(frozen=True)
class KafkaUser:
    role: str  # the part of dsec, e.g. "policy-engine"
    name: str  # the SCRAM user name
    acls: tuple[Acl, ...]


def _topic(name: str, *operations: str) -> Acl:
    return Acl("topic", name, "literal", operations)


def _group(prefix: str) -> Acl:
    return Acl("group", prefix, "prefix", (READ,))


def dsec_users(prefix: str = "dsec", user_prefix: str = "dsec-") -> dict[str, KafkaUser]:
    """Every dsec part's user and ACLs, for topics named ``<prefix>.…``; users are named
    ``<user_prefix><role>``."""
    t: TopicNames = topic_names(prefix)
    users = [
        # Probes write samples, and the in-process actuator reads commands (assigned, no
        # commits). A worker on the node actuator's socket needs only the first line.
        ("worker", (_topic(t.metrics, *PRODUCE), _topic(t.actuations, *CONSUME),
                    _group("dsec-worker-"))),
        ("node-actuator", (_topic(t.actuations, *CONSUME),
                           _topic(t.actuation_results, *PRODUCE),
                           _topic(t.dead_letters, *PRODUCE), _group(f"{prefix}-node-"),
                           # `dsec placement topology` runs beside it on each node
                           _topic(t.gpu_topology, *PRODUCE))),
        ("policy-engine", (_topic(t.features, *CONSUME), _topic(t.policies, *CONSUME),
                           _topic(t.pools, *CONSUME),
                           # the policy and pool versions its meta-policies tune
                           _topic(t.policies, *PRODUCE), _topic(t.pools, *PRODUCE),
                           _topic(t.actuations, *PRODUCE), _topic(t.decisions, *PRODUCE),
                           _topic(t.dead_letters, *PRODUCE), _topic(t.process_usage, *PRODUCE),
                           Acl("topic", f"{prefix}-policy-engine", "prefix", FAUST_APP),
                           _group(f"{prefix}-policy-engine"),
                           # the alert notifier, which runs beside it: decisions in, alert
                           # and GPU-health changes out (and read back whole at start)
                           _topic(t.decisions, *CONSUME), _topic(t.alerts, *CONSUME),
                           _topic(t.gpu_health, *CONSUME), _topic(t.alerts, *PRODUCE),
                           _topic(t.gpu_health, *PRODUCE), _group(f"{prefix}-alert-notifier"),
                           _group("dsec-policy-reader-"))),
        # the metrics job, and the fleet job: worker features and decisions in, each
        # worker's contribution re-keyed by pool through fleet-inputs, fleet features out
        ("stream-jobs", (_topic(t.metrics, *CONSUME), _topic(t.features, *PRODUCE),
                         _topic(t.gpu_profiles, *PRODUCE), _topic(t.dead_letters, *PRODUCE),
                         _topic(t.features, *CONSUME), _topic(t.decisions, *CONSUME),
                         _topic(t.fleet_inputs, *CONSUME), _topic(t.fleet_inputs, *PRODUCE),
                         # the metrics job reports each worker's cards; the card job reads them
                         _topic(t.gpu_cards, *PRODUCE), _topic(t.gpu_cards, *CONSUME),
                         _topic(t.process_usage, *PRODUCE),
                         Acl("topic", f"{prefix}-stream-jobs", "prefix", FAUST_APP),
                         _group(f"{prefix}-stream-jobs"))),
        ("sink", (*(_topic(name, *CONSUME) for name in (
            t.metrics, t.features, t.gpu_profiles, t.actuations, t.actuation_results,
            t.decisions, t.dead_letters, t.alerts, t.gpu_health, t.process_usage,
            t.gpu_personalities, t.workload_affinity, t.gpu_topology)),
            _topic(t.dead_letters, *PRODUCE), _topic(t.process_usage, *PRODUCE),
            _group(f"{prefix}-clickhouse-sink"))),
        # the personality job: features, GPU profiles and its own history in (read back
        # whole at start), personalities and workload affinity out; without a store, the
        # recommendations read GPU health and topology from their topics too
        ("placement", (*(_topic(name, *CONSUME) for name in (
            t.features, t.gpu_profiles, t.gpu_personalities, t.workload_affinity,
            t.gpu_health, t.gpu_topology)),
            _topic(t.gpu_personalities, *PRODUCE), _topic(t.workload_affinity, *PRODUCE),
            _topic(t.dead_letters, *PRODUCE), _group(f"{prefix}-placement"),
            _group("dsec-placement-reader-"))),
        ("gateway", (_topic(t.metrics, *PRODUCE), _topic(t.actuations, *CONSUME),
                     _topic(t.actuation_results, *PRODUCE), _topic(t.dead_letters, *PRODUCE),
                     _group("dsec-gateway-webhooks-"))),
        # dsec policy and dsec pool: read the policies and pools topics whole, then write.
        ("publisher", (_topic(t.policies, *CONSUME), _topic(t.policies, *PRODUCE),
                       _topic(t.pools, *CONSUME), _topic(t.pools, *PRODUCE),
                       _group("dsec-policy-reader-"))),
        # dsec init: the topics and the Faust apps' changelogs, made before the services.
        ("init", (Acl("topic", f"{prefix}.", "prefix", (CREATE, DESCRIBE, DESCRIBE_CONFIGS)),
                  Acl("topic", f"{prefix}-", "prefix", (CREATE, DESCRIBE, DESCRIBE_CONFIGS)))),
    ]
    return {role: KafkaUser(role, f"{user_prefix}{role}", _merged(acls)) for role, acls in users}


def _merged(acls: Iterable[Acl]) -> tuple[Acl, ...]:
    """One entry per resource, its operations in first-seen order."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for acl in acls:
        ops = merged.setdefault((acl.resource, acl.name, acl.pattern), [])
        ops.extend(op for op in acl.operations if op not in ops)
    return tuple(Acl(r, n, p, tuple(ops)) for (r, n, p), ops in merged.items())  # type: ignore[arg-type]


def strimzi_users(prefix: str, cluster: str, user_prefix: str = "dsec-") -> list[dict]:
    """A Strimzi ``KafkaUser`` a dsec user: SCRAM-SHA-512 authentication (Strimzi makes
    the password Secret of the user's name) and simple authorization with its ACLs."""
    return [{
        "apiVersion": "kafka.strimzi.io/v1beta2",
        "kind": "KafkaUser",
        "metadata": {"name": user.name, "labels": {"strimzi.io/cluster": cluster,
                                                   "app.kubernetes.io/part-of": "dsec"}},
        "spec": {
            "authentication": {"type": "scram-sha-512"},
            "authorization": {"type": "simple", "acls": [
                {"resource": {"type": acl.resource, **(
                    {} if acl.resource == "cluster"
                    else {"name": acl.name, "patternType": acl.pattern})},
                 "operations": list(acl.operations)}
                for acl in user.acls
            ]},
        },
    } for user in dsec_users(prefix, user_prefix).values()]


def helm_acls() -> dict[str, list[dict]]:
    """The ACLs as the chart's values hold them (``kafka.users.acls``), the topic prefix
    written ``{prefix}`` so the chart renders them for its own ``kafka.topicPrefix``."""
    return {user.role: [{"type": acl.resource, "name": acl.name, "patternType": acl.pattern,
                         "operations": list(acl.operations)} for acl in user.acls]
            for user in dsec_users("{prefix}").values()}


def acl_bindings(user: KafkaUser) -> list:
    """The user's ACLs as confluent-kafka ``AclBinding``s (allow, any host)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    resource_types = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                      "cluster": ResourceType.BROKER}
    patterns = {"literal": ResourcePatternType.LITERAL, "prefix": ResourcePatternType.PREFIXED}
    operations = {READ: AclOperation.READ, WRITE: AclOperation.WRITE,
                  DESCRIBE: AclOperation.DESCRIBE, CREATE: AclOperation.CREATE,
                  DESCRIBE_CONFIGS: AclOperation.DESCRIBE_CONFIGS,
                  ALTER_CONFIGS: AclOperation.ALTER_CONFIGS}
    return [
        AclBinding(resource_types[acl.resource],
                   "kafka-cluster" if acl.resource == "cluster" else acl.name,
                   patterns[acl.pattern], f"User:{user.name}", "*", operations[operation],
                   AclPermissionType.ALLOW)
        for acl in user.acls for operation in acl.operations
    ]


def apply_users(admin_config: dict, users: Iterable[KafkaUser], passwords: dict[str, str],
                timeout_s: float = 30.0) -> None:
    """Creates (or resets) each user's SCRAM-SHA-512 credential and its ACLs, as the
    admin in ``admin_config`` (librdkafka settings of a super user)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(admin_config)
    users = list(users)
    upserts = [UserScramCredentialUpsertion(
        user.name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
        passwords[user.name].encode()) for user in users]
    for future in admin.alter_user_scram_credentials(
            upserts, request_timeout=timeout_s).values():
        future.result()
    bindings = [binding for user in users for binding in acl_bindings(user)]
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result()
