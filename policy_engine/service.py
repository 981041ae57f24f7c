"""Wiring the policy engine into a Faust app: the registry built from the built-in pack
and the policies topic, the pools from the pools topic (both verified against the trust
list), then the agents, signing commands with the command-signer key."""

from __future__ import annotations

import contextlib

from dsec.infra.faust_app import App
from dsec.infra.keys import signer_for, verifier_for
from dsec.infra.observability.metrics import ProcessMetrics
from dsec.infra.topics import ensure_changelog_topics
from dsec.policy_engine.agent import (
    TABLES,
    EngineCounters,
    EngineOptions,
    register_policy_engine,
)
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.limits import PolicyLimits
from dsec.policy_engine.policy_log import read_policy_log, read_pool_log
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import PolicyDecision, topic_names
from dsec.schemas.settings import DsecSettings
from dsec.schemas.trust import KeyRole


def build_registry(settings: DsecSettings) -> tuple[PolicyRegistry, list[PolicyDecision], int]:
    """The registry, what loading it decided (for the audit log), and the policies-topic
    offset the engine's agent takes over from."""
    registry = PolicyRegistry(verifier_for(settings), PolicyLimits.from_settings(settings))
    decisions: list[PolicyDecision] = []
    for policy in load_builtin_policies(settings.policy_params,
                                        dry_run=settings.policy_dry_run):
        record = registry.install_trusted(policy)
        if record is not None:
            decisions.append(record)
    records, next_offset = read_policy_log(settings)
    for entry in records:
        record = registry.offer(entry.key, entry.value)
        if record is not None:
            decisions.append(record)
    return registry, decisions, next_offset


def build_pools(settings: DsecSettings) -> tuple[PoolRegistry, list[PolicyDecision], int]:
    """The pools, what loading them decided, and the pools-topic offset to take over from."""
    pools = PoolRegistry(verifier_for(settings))
    decisions: list[PolicyDecision] = []
    records, next_offset = read_pool_log(settings)
    for entry in records:
        record = pools.offer(entry.key, entry.value)
        if record is not None:
            decisions.append(record)
    return pools, decisions, next_offset


def register(
    app: App, settings: DsecSettings, options: EngineOptions | None = None,
    metrics: ProcessMetrics | None = None,
) -> EngineCounters:
    ensure_changelog_topics(settings, app.conf.id, list(TABLES), app.conf.topic_partitions)
    registry, decisions, next_offset = build_registry(settings)
    pools, pool_decisions, pools_offset = build_pools(settings)
    # The policy and pool versions meta-policies tune are signed with the publisher keys
    # the engine is given; without them a tuning is audited as an evaluation error.
    signer = signer_for(settings, KeyRole.COMMAND_SIGNER,
                        also=[KeyRole.POLICY_PUBLISHER, KeyRole.POOL_PUBLISHER])
    return register_policy_engine(
        app, topic_names(settings.topic_prefix), registry, signer,
        options=options, startup_decisions=decisions + pool_decisions,
        policies_from_offset=next_offset, metrics=metrics, pools=pools,
        pools_from_offset=pools_offset,
    )


def run_policy_engine(settings: DsecSettings, options: EngineOptions | None = None) -> None:
    """The policy engine on its own (no stream jobs, no store) until SIGINT/SIGTERM."""
    from confluent_kafka.admin import AdminClient

    from dsec.infra.faust_app import QuietWorker, make_faust_app, watch_faust_app
    from dsec.infra.observability.server import serve_metrics
    from dsec.infra.topics import ensure_topics

    settings.data_dir.resolve().mkdir(parents=True, exist_ok=True)
    ensure_topics(settings)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap, **settings.kafka_security()})
    features = topic_names(settings.topic_prefix).features
    partitions = len(admin.list_topics(features, timeout=30).topics[features].partitions)
    app = make_faust_app(f"{settings.topic_prefix}-policy-engine", settings, partitions)
    metrics = ProcessMetrics()
    register(app, settings, options, metrics=metrics)
    topics = topic_names(settings.topic_prefix)
    watch_faust_app(app, metrics, {topics.features: "policy-engine",
                                   topics.policies: "policy-engine",
                                   topics.pools: "policy-engine"})
    server = serve_metrics(settings, metrics)
    worker = QuietWorker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    try:
        with contextlib.suppress(SystemExit):
            worker.execute_from_commandline()
    finally:
        if server is not None:
            server.stop()
