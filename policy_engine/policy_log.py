"""The compacted policies and pools topics as logs of record: read one whole, publish,
delete."""

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
    PoolDeletion,
    PoolSpec,
    SignatureError,
    Verifier,
    encode,
    topic_names,
)
from dsec.schemas.policies import policy_key
from dsec.schemas.settings import DsecSettings


class PolicyLogError(RuntimeError):
    """The policies or pools topic could not be read or written."""


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
    raise PolicyLogError(f"record at offset {message.offset()} unreadable: {reason}")


def read_policy_log(settings: DsecSettings, timeout_s: float = 30.0) -> tuple[
        list[PolicyRecord], int]:
    """Every record of the policies topic up to the end as of now, and the offset after
    the last one."""
    return read_log(settings, topic_names(settings.topic_prefix).policies, timeout_s)


def read_pool_log(settings: DsecSettings, timeout_s: float = 30.0) -> tuple[
        list[PolicyRecord], int]:
    """The same for the pools topic."""
    return read_log(settings, topic_names(settings.topic_prefix).pools, timeout_s)


def read_log(settings: DsecSettings, topic: str, timeout_s: float = 30.0) -> tuple[
        list[PolicyRecord], int]:
    """Every record of the one-partition ``topic`` up to the end as of now, and the offset
    after the last one."""
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
    """The highest version of ``name`` (fleet or canary) a record signed with a trusted
    key published or deleted; a newer one is what the engine will run."""
    versions = []
    for record in records:
        keyed = (record.key or b"").decode("utf-8", "replace").partition("@")[0]
        if record.value is None or keyed != name:
            continue
        try:
            parsed = parse_record(record.value)
            verifier.verify(parsed)
        except (PolicyRejected, SignatureError):
            continue
        versions.append(parsed.up_to_version if isinstance(parsed, PolicyDeletion)
                        else parsed.version)
    return max(versions, default=None)


def _produce(settings: DsecSettings, records: list[tuple[str, bytes, bytes]],
             timeout_s: float) -> None:
    """``records`` (topic, key, value), delivered in order before this returns."""
    producer = make_producer(settings, "dsec-policy-cli")
    failures: list[str] = []

    def delivered(err, _message) -> None:
        if err is not None:
            failures.append(str(err))

    for topic, key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    if producer.flush(timeout_s) != 0 or failures:
        raise PolicyLogError(f"not delivered: {failures or 'timeout'}")


def publish_policy(settings: DsecSettings, signed: PolicySpec, timeout_s: float = 30.0) -> None:
    publish_policy_records(settings, [signed], timeout_s)


def delete_policy(
    settings: DsecSettings, signed: PolicyDeletion, timeout_s: float = 30.0
) -> None:
    publish_policy_records(settings, [signed], timeout_s)


def publish_policy_records(settings: DsecSettings, records: list[PolicySpec | PolicyDeletion],
                           timeout_s: float = 30.0) -> None:
    """Signed versions and deletions, keyed by ``policy_key``, in this order (one
    partition: the engine reads them in it)."""
    topic = topic_names(settings.topic_prefix).policies
    _produce(settings, [
        (topic, policy_key(r.deletes, r.pool).encode() if isinstance(r, PolicyDeletion)
         else policy_key(r.name, r.pool).encode(), encode(r))
        for r in records], timeout_s)


def publish_pool(settings: DsecSettings, signed: PoolSpec | PoolDeletion,
                 timeout_s: float = 30.0) -> None:
    name = signed.deletes if isinstance(signed, PoolDeletion) else signed.name
    _produce(settings, [(topic_names(settings.topic_prefix).pools, name.encode(),
                         encode(signed))], timeout_s)
