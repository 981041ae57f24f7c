"""The reaction bench's stage times: its topics read to their end by a bounded
ConsumerLoop, on the in-memory consumer double, the earliest CreateTime of each stage
kept per worker."""

from __future__ import annotations

from consumer_double import InMemoryLog

from dsec.bench.reaction_trace import read_stage_times
from dsec.schemas import (
    ActuationCommand,
    FeatureEvent,
    MetricBatch,
    MetricColumns,
    WorkerIdentity,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.metrics import StepColumns
from dsec.schemas.settings import DsecSettings

SETTINGS = DsecSettings(bootstrap="127.0.0.1:1", topic_prefix="trial")
TOPICS = topic_names("trial")
POLICY = "precision-downgrade"


def _who(worker_id: str) -> WorkerIdentity:
    return WorkerIdentity(job_id="job", node_id="n0", worker_id=worker_id)


def _steps(worker_id: str, nonfinite: bool) -> bytes:
    t_ms = now_ms()
    return encode(MetricBatch(identity=_who(worker_id), columns=MetricColumns(step=StepColumns(
        event_time_ms=[t_ms], step=[1], loss=[None], grad_norm=[1.0],
        loss_nonfinite=[nonfinite]))))


def _command(worker_id: str, policy: str) -> bytes:
    t_ms = now_ms()
    return encode(ActuationCommand(
        actuation_id=f"{worker_id}-{policy}"[:64].ljust(8, "x"), target=_who(worker_id),
        event_time_ms=t_ms, expires_at_ms=t_ms + 60_000, policy_name=policy,
        policy_version=1, action=SnapshotParams()))


def test_the_earliest_time_of_each_stage_is_kept_per_worker() -> None:
    log = InMemoryLog()
    log.append(TOPICS.metrics, _steps("w1", nonfinite=True), partitions=2, timestamp_ms=120)
    log.append(TOPICS.metrics, _steps("w1", nonfinite=True), partition=1, partitions=2,
               timestamp_ms=100)
    log.append(TOPICS.metrics, _steps("w2", nonfinite=False), timestamp_ms=90)
    log.append(TOPICS.metrics, b"not a batch", timestamp_ms=80)  # not this bench's to judge
    log.append(TOPICS.features, encode(FeatureEvent(
        identity=_who("w1"), features={"loss_nonfinite_count": 1.0})), timestamp_ms=150)
    log.append(TOPICS.actuations, _command("w1", "memory-cap"), timestamp_ms=160)
    log.append(TOPICS.actuations, _command("w1", POLICY), timestamp_ms=170)
    stages = read_stage_times(SETTINGS, ["w1", "w2"], POLICY, timeout_s=30,
                              consumer_factory=log.consumer)
    w1, w2 = stages["w1"], stages["w2"]
    assert (w1.published_ms, w1.features_ms, w1.command_ms) == (100, 150, 170)
    assert (w2.published_ms, w2.features_ms, w2.command_ms) == (None, None, None)
    assert log.commits == []
