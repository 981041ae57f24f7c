"""Creates dsec's topics with their settings, idempotently."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dsec.schemas.settings import DsecSettings
from dsec.schemas.topics import TOPICS

log = logging.getLogger(__name__)
# Under least privilege a service's user sees only its own topics in the metadata and
# may create none: the others are dsec init's to make (docs/operations.md).
_NOT_OURS = ("TOPIC_ALREADY_EXISTS", "TOPIC_AUTHORIZATION_FAILED")


def ensure_topics(
    settings: DsecSettings,
    partitions: int | None = None,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> list[str]:
    """Creates every missing topic; ``partitions`` overrides the defaults, except compacted."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap, **settings.kafka_security()})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = []
    for spec in TOPICS.values():
        name = spec.name(settings.topic_prefix)
        if name in existing:
            continue
        count = spec.partitions if (partitions is None or spec.compacted) else partitions
        wanted.append(NewTopic(name, count, replication_factor, config=spec.config()))
    created: list[str] = []
    if not wanted:
        return created
    for name, future in admin.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() not in _NOT_OURS:
                raise
            if exc.args[0].name() == "TOPIC_AUTHORIZATION_FAILED":
                log.info("dsec: %s is not this user's to create (dsec init makes it)", name)
    return created


def ensure_changelog_topics(
    settings: DsecSettings, app_id: str, tables: list[str], partitions: int
) -> None:
    """Faust table changelogs, made before Faust starts: a changelog Faust creates itself
    can be missing from the first metadata it reads, and its agent then stalls."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap, **settings.kafka_security()})
    wanted = [
        NewTopic(f"{app_id}-{table}-changelog", partitions, 1,
                 config={"cleanup.policy": "compact"})
        for table in tables
    ]
    for future in admin.create_topics(wanted, request_timeout=30).values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
