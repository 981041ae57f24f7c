"""``dsec kafka``: the local KRaft broker (fetch its jars, run it, alone or as a cluster,
with or without SASL and ACLs) and the ACLs each dsec part needs."""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from dsec.schemas.settings import DsecSettings

kafka_app = typer.Typer(no_args_is_help=True, help="The local Kafka broker.")
console = Console()


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Resolve the broker's jars from Maven Central into the cache (quick when cached)."""
    from dsec.infra.kafka_local import KAFKA_VERSION, fetch_jars

    console.print(f"Kafka {KAFKA_VERSION} jars in {fetch_jars()}")


@kafka_app.command("run")
def kafka_run(
    port: Annotated[int, typer.Option(help="Client port on 127.0.0.1 (0: any free).")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="Broker data folder.")] = None,
    acls: Annotated[bool, typer.Option(
        help="SASL/SCRAM and the StandardAuthorizer: a user per dsec part with only its "
             "ACLs (credentials in <data dir>/kafka/users.json).")] = False,
    brokers: Annotated[int, typer.Option(
        min=1, max=5, help="KRaft nodes (broker and controller each, on free ports); with "
                           "3 or more, topics are replicated 3 times, min.insync.replicas 2."
    )] = 1,
    heap_mb: Annotated[int, typer.Option(min=256, help="Java heap of each node.")] = 768,
) -> None:
    """Run the local KRaft broker with dsec's topics until Ctrl-C (for DSEC_TEST_BOOTSTRAP)."""
    import signal

    from dsec.infra.kafka_cluster import LocalKafkaCluster
    from dsec.infra.kafka_local import KAFKA_VERSION, BrokerAuth, LocalKafka
    from dsec.infra.stop_signals import StopSignals
    from dsec.infra.topics import ensure_topics

    if brokers > 1 and (acls or port):
        raise typer.BadParameter("--acls and --port are for a single broker",
                                 param_hint="--brokers")
    settings = DsecSettings(**({} if data_dir is None else {"data_dir": data_dir}))
    kafka_dir = settings.data_dir.resolve() / "kafka"
    broker: LocalKafka | LocalKafkaCluster = (
        LocalKafka(data_dir=kafka_dir, port=port, heap_mb=heap_mb,
                   auth=BrokerAuth() if acls else None) if brokers == 1
        else LocalKafkaCluster(data_dir=kafka_dir, brokers=brokers, heap_mb=heap_mb))
    stop = StopSignals((signal.SIGTERM,))
    try:
        bootstrap = broker.start()
        update: dict[str, object] = {"bootstrap": bootstrap,
                                     "replication_factor": min(3, brokers)}
        if isinstance(broker, LocalKafka) and broker.auth is not None:
            update |= {"kafka_security_protocol": "SASL_PLAINTEXT",
                       "kafka_sasl_mechanism": "SCRAM-SHA-512",
                       "kafka_sasl_username": broker.auth.admin_user,
                       "kafka_sasl_password": SecretStr(broker.auth.admin_password)}
        ensure_topics(settings.model_copy(update=update))
        if acls:
            console.print(f"users and passwords: {_make_kafka_users(broker, settings)}")
        console.print(f"Kafka {KAFKA_VERSION} on {bootstrap}; Ctrl-C stops it")
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()


class AclFormat(StrEnum):
    table = "table"
    strimzi = "strimzi"
    helm = "helm"


@kafka_app.command("acls")
def kafka_acls(
    output: Annotated[AclFormat, typer.Option("--format", help="table; strimzi: KafkaUser "
                                              "objects; helm: the chart's kafka.users.acls")
                      ] = AclFormat.table,
    cluster: Annotated[str, typer.Option(help="The Strimzi cluster (--format strimzi).")
                       ] = "kafka",
) -> None:
    """Each dsec part's Kafka user and the ACLs it needs, for DSEC_TOPIC_PREFIX."""
    import yaml

    from dsec.infra.kafka_acls import dsec_users, helm_acls, strimzi_users

    prefix = DsecSettings().topic_prefix
    if output is AclFormat.strimzi:
        print(yaml.safe_dump_all(strimzi_users(prefix, cluster), sort_keys=False), end="")
        return
    if output is AclFormat.helm:
        print(yaml.safe_dump({"acls": helm_acls()}, sort_keys=False), end="")
        return
    table = Table()
    for column in ("user", "resource", "name", "pattern", "operations"):
        table.add_column(column)
    for user in dsec_users(prefix).values():
        for acl in user.acls:
            table.add_row(user.name, acl.resource, acl.name, acl.pattern,
                          ",".join(acl.operations))
    console.print(table)


def _make_kafka_users(broker, settings: DsecSettings) -> Path:
    """dsec's users with their ACLs on ``broker``; their credentials in an owner-only file."""
    import secrets

    from dsec.infra.kafka_acls import apply_users, dsec_users

    users = dsec_users(settings.topic_prefix)
    passwords = {user.name: secrets.token_hex(16) for user in users.values()}
    apply_users(broker.client_config(), users.values(), passwords)
    path = broker.data_dir / "users.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"bootstrap": broker.bootstrap, "mechanism": "SCRAM-SHA-512",
                   "admin": broker.client_config()["sasl.username"],
                   "admin_password": broker.client_config()["sasl.password"],
                   "users": {user.role: {"username": user.name,
                                         "password": passwords[user.name]}
                             for user in users.values()}}, handle, indent=2)
    return path
