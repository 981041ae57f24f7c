from __future__ import annotations

import orjson
import pytest

from dsec.schemas import (
    ActuationCommand,
    DeadLetter,
    DecodeError,
    EpisodeSample,
    FeatureEvent,
    MetricBatch,
    StepSample,
    WorkerIdentity,
    decode,
    encode,
    topic_names,
)
from dsec.schemas.actuations import MemoryCapParams, SnapshotParams
from dsec.schemas.export import export_json_schemas
from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES, fleet_identity
from dsec.schemas.signing import canonical_bytes

IDENTITY = WorkerIdentity(job_id="job", worker_id="w0", node_id="n0")


def test_metric_batch_round_trips() -> None:
    batch = MetricBatch(
        identity=IDENTITY,
        samples=[
            StepSample(event_time_ms=1, step=3, loss=0.5, grad_norm=1.5),
            EpisodeSample(event_time_ms=2, episode_index=0, reward=12.0, length=12,
                          termination_reason="pole_fell"),
        ],
    )
    decoded = decode(encode(batch), MetricBatch)
    assert decoded == batch
    assert [s.kind for s in decoded.samples] == ["step", "episode"]


def test_every_event_has_version_id_and_time() -> None:
    a = FeatureEvent(identity=IDENTITY, features={"reward_mean": 1.0})
    b = FeatureEvent(identity=IDENTITY, features={"reward_mean": 1.0})
    assert a.schema_version == 1
    assert a.event_id != b.event_id
    assert a.event_time_ms > 1_700_000_000_000


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"not json", "invalid MetricBatch"),
        (b'{"identity": {"job_id": "j", "worker_id": "w", "node_id": "n"}, '
         b'"columns": {"step": {"event_time_ms": [1], "step": [1, 2]}}}', "equal lengths"),
        (b'{"identity": {"job_id": "j", "worker_id": "w", "node_id": "n"}, '
         b'"columns": {"step": {"event_time_ms": [1], "step": [-1]}}}', "columns.step.step.0"),
        (b'{"identity": {"job_id": "j", "worker_id": "w", "node_id": "n"}, '
         b'"samples": [{"kind": "bogus", "event_time_ms": 1}]}', "samples.0"),
        (b'{"schema_version": 2, "identity": {"job_id": "j", "worker_id": "w", "node_id": "n"},'
         b' "samples": []}', "schema_version"),
        (None, "tombstone"),
    ],
)
def test_invalid_metrics_say_why(payload: bytes | None, fragment: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(payload, MetricBatch)
    assert fragment in info.value.reason


def test_identifiers_are_constrained() -> None:
    with pytest.raises(DecodeError):
        decode(b'{"job_id": "j", "worker_id": "w 0; drop", "node_id": "n"}', WorkerIdentity)


def test_an_identity_without_pool_or_labels_keeps_its_canonical_form() -> None:
    assert canonical_bytes(IDENTITY) == b'{"job_id":"job","node_id":"n0","worker_id":"w0"}'
    pooled = WorkerIdentity(job_id="job", worker_id="w0", node_id="n0", pool="A",
                            labels={"rack": "r1"})
    assert decode(encode(pooled), WorkerIdentity) == pooled
    assert len({pooled, decode(encode(pooled), WorkerIdentity), IDENTITY}) == 2
    with pytest.raises(ValueError, match="reserved label names: pool"):
        WorkerIdentity(job_id="job", worker_id="w0", node_id="n0", labels={"pool": "B"})


def test_fleet_feature_events_name_their_pool_where_a_worker_would_be() -> None:
    event = FeatureEvent(identity=fleet_identity("job", "A"), scope="pool", window="1h",
                         features={"breaker_trips_per_hour": 4.0}, tags={"pool": "A"})
    assert event.identity.worker_id == "pool:A" and event.identity.node_id == "fleet"
    assert decode(encode(event), FeatureEvent).target_pool() == "A"
    assert fleet_identity("job").worker_id == "job" and fleet_identity("job").pool is None
    worker = FeatureEvent(identity=IDENTITY, features={}, tags={"pool": "B"})
    assert worker.scope == "worker" and worker.target_pool() == "B"
    assert set(FLEET_FEATURES).isdisjoint(WORKER_FEATURES)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_features_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="finite number"):
        FeatureEvent(identity=IDENTITY, features={"grad_norm": 1.0, "reward_variance": value})
    wire = encode(FeatureEvent(identity=IDENTITY, features={"reward_variance": 1.0}))
    for text in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        with pytest.raises(DecodeError, match=r"features\.reward_variance"):
            decode(wire.replace(b"1.0", text), FeatureEvent)


def test_action_parameters_are_bounded() -> None:
    with pytest.raises(ValueError):
        MemoryCapParams(limit_bytes=1)
    with pytest.raises(ValueError):
        MemoryCapParams(limit_bytes=1 << 50)
    assert MemoryCapParams(limit_bytes=4 << 30).limit_bytes == 4 << 30


def test_an_undo_may_return_to_the_workers_own_setting_and_nothing_else() -> None:
    from pydantic import ValidationError

    from dsec.schemas.actuations import (
        GradAccumulationParams,
        GradCompressionParams,
        PrecisionParams,
    )

    assert PrecisionParams(dtype="original").dtype == "original"
    assert GradCompressionParams(bits="original").bits == "original"
    assert GradAccumulationParams(steps="original").steps == "original"
    for model, field in ((PrecisionParams, "dtype"), (GradCompressionParams, "bits"),
                         (GradAccumulationParams, "steps")):
        with pytest.raises(ValidationError):
            model(**{field: "own"})


def test_command_expiry_is_bounded() -> None:
    common = dict(actuation_id="a" * 16, target=IDENTITY, policy_name="p", policy_version=1,
                  action=SnapshotParams(), event_time_ms=1_000)
    assert ActuationCommand(expires_at_ms=61_000, **common).expires_at_ms == 61_000
    with pytest.raises(ValueError, match="expires_at_ms"):
        ActuationCommand(expires_at_ms=1_000, **common)
    with pytest.raises(ValueError, match="expires_at_ms"):
        ActuationCommand(expires_at_ms=10_000_000, **common)


def test_dead_letter_keeps_binary_payloads() -> None:
    letter = DeadLetter.for_message(topic="t", partition=0, offset=5, reason="bad",
                                    payload=b"\xff\xfe")
    assert letter.payload_encoding == "base64"
    big = DeadLetter.for_message(topic="t", partition=0, offset=5, reason="bad",
                                 payload=b"x" * 100_000)
    assert big.payload_truncated and len(big.payload) == 64 * 1024


def test_topic_names_use_the_prefix() -> None:
    names = topic_names("abc")
    assert names.metrics == "abc.metrics.v1"
    assert names.policies == "abc.policies.v1"


def test_json_schemas_export(tmp_path) -> None:
    written = export_json_schemas(tmp_path)
    assert {p.name for p in written} >= {"metric_batch.schema.json",
                                         "actuation_command.schema.json"}


def test_rows_pivot_to_columns_and_back() -> None:
    from dsec.schemas.metrics import columns_from_rows

    rows = [
        {"kind": "step", "event_id": "x" * 8, "event_time_ms": 1, "step": 0, "loss": 0.5},
        {"kind": "step", "event_id": "y" * 8, "event_time_ms": 2, "step": 1,
         "loss_nonfinite": True},
        {"kind": "episode", "event_time_ms": 3, "episode_index": 0, "reward": 2.0, "length": 4},
    ]
    columns = columns_from_rows(rows)
    assert columns["step"] == {"event_time_ms": [1, 2], "step": [0, 1], "loss": [0.5, None],
                               "loss_nonfinite": [False, True]}
    batch = decode(orjson.dumps({"identity": IDENTITY.model_dump(), "columns": columns}),
                   MetricBatch)
    back = batch.rows()
    assert [s.kind for s in back] == ["step", "step", "episode"]
    assert back[1].loss is None and back[1].loss_nonfinite and back[2].reward == 2.0
