"""The compacted policies topic as a log of record: read it whole, publish, delete."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    Start,
    TopicMissing,
)
from dsec.infra.kafka_clients import consumer_config, make_producer
from dsec.policy_engine.registry import PolicyRejected, parse_record
from dsec.schemas import (
    PolicyDeletion,
    PolicySpec,
    SignatureError,
    Verifier,
    encode,
    topic_names,
)
from dsec.schemas.settings import DsecSettings


class PolicyLogError(RuntimeError):
    """The policies topic could not be read or written."""


@dataclass(frozen=True)
class PolicyRecord:
    key: bytes | None
    value: bytes | None  # None: a tombstone
    offset: int


class _Records(BatchWriter[list]):
    def __init__(self) -> None:
        self.records: list[PolicyRecord] = []

    def write(self, batch: list) -> None:
        self.records += [PolicyRecord(m.key(), m.value(), m.offset()) for m in batch]


def _unreadable(message, reason: str) -> None:
    raise PolicyLogError(f"policy record at offset {message.offset()} unreadable: {reason}")


def read_policy_log(settings: DsecSettings, timeout_s: float = 30.0) -> tuple[
        list[PolicyRecord], int]:
    """Every record up to the end as of now, and the offset after the last one."""
    topic = topic_names(settings.topic_prefix).policies
    group = f"dsec-policy-reader-{uuid.uuid4().hex[:8]}"
    writer = _Records()
    loop = ConsumerLoop(
        ConsumerLoopConfig((topic,), group, poll_timeout_s=0.5, start=Start.BEGINNING,
                           assign=True, until_end=True, commit=False,
                           metadata_timeout_s=timeout_s),
        consumer_config(settings, group), writer, _unreadable, service="policy-reader")
    try:
        reached = loop.run(timeout_s=timeout_s)
    except TopicMissing as exc:
        raise PolicyLogError(str(exc)) from exc
    if len(loop.end_offsets) != 1:
        raise PolicyLogError(f"{topic} must have one partition, so order is total")
    high = loop.end_offsets[(topic, 0)]
    if not reached:
        raise PolicyLogError(f"timed out reading {topic} up to offset {high}")
    return writer.records, high


def topic_version(records: list[PolicyRecord], name: str, verifier: Verifier) -> int | None:
    """The highest version of ``name`` a record signed with a trusted key published or
    deleted; a newer one is what the engine will run."""
    versions = []
    for record in records:
        if record.value is None or (record.key or b"").decode("utf-8", "replace") != name:
            continue
        try:
            parsed = parse_record(record.value)
            verifier.verify(parsed)
        except (PolicyRejected, SignatureError):
            continue
        versions.append(parsed.up_to_version if isinstance(parsed, PolicyDeletion)
                        else parsed.version)
    return max(versions, default=None)


def _produce(settings: DsecSettings, key: bytes, value: bytes | None, timeout_s: float) -> None:
    producer = make_producer(settings, "dsec-policy-cli")
    failures: list[str] = []

    def delivered(err, _message) -> None:
        if err is not None:
            failures.append(str(err))

    producer.produce(topic_names(settings.topic_prefix).policies, key=key, value=value,
                     on_delivery=delivered)
    if producer.flush(timeout_s) != 0 or failures:
        raise PolicyLogError(f"not delivered: {failures or 'timeout'}")


def publish_policy(settings: DsecSettings, signed: PolicySpec, timeout_s: float = 30.0) -> None:
    _produce(settings, signed.name.encode(), encode(signed), timeout_s)


def delete_policy(
    settings: DsecSettings, signed: PolicyDeletion, timeout_s: float = 30.0
) -> None:
    _produce(settings, signed.deletes.encode(), encode(signed), timeout_s)
