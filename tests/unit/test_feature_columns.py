"""Feature events as columns: a ``FeatureColumns`` message carries exactly the events it
was packed from; a bad one is refused with its reason; the metrics job sends one message
per features partition, each row where its worker's single event would go; the engine
and the sink take the rows as they would take the events."""

from __future__ import annotations

import base64
import math

import numpy as np
import orjson
import pytest
from aiokafka.partitioner import murmur2
from feature_values import HEALTHY, STUCK
from keys import KEYRING, VERIFIER

from dsec.bench.traces import TraceIdentity, grad_norm_decay
from dsec.infra.records import Record
from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.feature_batch import FeatureBatch
from dsec.policy_engine.policy_agent import PolicyAgent
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import DecodeError, FeatureEvent, WorkerIdentity, encode
from dsec.schemas.feature_columns import (
    FeatureRows,
    decode_features,
    feature_events,
    pack_feature_events,
)
from dsec.schemas.topics import topic_names
from dsec.stream_jobs.metrics_job import FEATURE_MESSAGE_MAX_BYTES, MetricsJob

TOPICS = topic_names("t")


def _events() -> list[FeatureEvent]:
    return [
        FeatureEvent(event_id="feature-0000", event_time_ms=1_000,
                     identity=WorkerIdentity(job_id="j", worker_id="w0", node_id="n0"),
                     features={"a": 1.0, "b": -2.5}),
        FeatureEvent(event_id="feature-0001", event_time_ms=2_000,
                     identity=WorkerIdentity(job_id="j", worker_id="w1", node_id="n0",
                                             pool="p1", labels={"rack": "r7"}),
                     gpu_uuid="GPU-1", window="gpu", features={"b": 0.0, "c": 1e300},
                     tags={"pool": "p1", "gpu_model": "H100"}),
        FeatureEvent(event_id="feature-0002", event_time_ms=3_000,
                     identity=WorkerIdentity(job_id="j", worker_id="w2", node_id="n1"),
                     features={}, tags={"pool": "p2"}),
    ]


def _wire(events: list[FeatureEvent]) -> bytes:
    return encode(pack_feature_events(events, "message-0001", 5_000))


def test_columns_carry_exactly_the_events_they_were_packed_from() -> None:
    events = _events()
    decoded = decode_features(_wire(events))
    assert isinstance(decoded, FeatureRows) and len(decoded) == 3
    assert decoded.events() == events
    assert feature_events(_wire(events)) == events
    assert decoded.target_pools() == [event.target_pool() for event in events]
    assert math.isnan(decoded.features["a"][1]) and decoded.features["c"][1] == 1e300


def test_a_single_event_still_decodes_as_one_even_with_a_tag_named_form() -> None:
    event = FeatureEvent(identity=WorkerIdentity(job_id="j", worker_id="w", node_id="n"),
                         features={"form": 1.0}, tags={"form": "columns"})
    assert decode_features(encode(event)) == event
    assert feature_events(encode(event)) == [event]


def _altered(change) -> bytes:
    document = orjson.loads(_wire(_events()))
    change(document)
    return orjson.dumps(document)


def _values(*values: float) -> dict:
    return {"dtype": "<f8", "data": base64.b64encode(np.array(values, "<f8").tobytes()).decode()}


@pytest.mark.parametrize(("change", "reason"), [
    (lambda d: d["worker_ids"].pop(), "worker_ids: 2 rows where event_ids has 3"),
    (lambda d: d["node_ids"].__setitem__(0, "bad node"), "node_ids.0: String should match"),
    (lambda d: d.__setitem__("feature_values", _values(1.0, 2.0)),
     "feature_values: 2 values where 3 names of 3 rows take 9"),
    (lambda d: d["feature_values"].__setitem__("dtype", "<f4"), "feature_values.dtype"),
    (lambda d: d["feature_values"].__setitem__("data", "!!!!"), "not base64"),
    (lambda d: d.__setitem__("feature_names", ["a", "a", "b"]), "a name is given twice"),
    (lambda d: d.__setitem__("feature_values", _values(*[1.0] * 4, math.inf, *[1.0] * 4)),
     "feature_values: a value of b is infinite"),
    (lambda d: d.__setitem__("form", "rows"), "form: Input should be 'columns'"),
    (lambda d: d.__setitem__("labels", [None, {"pool": "x"}, None]), "reserved label names"),
    (lambda d: d.__setitem__("extra", 1), "extra: Extra inputs are not permitted"),
])
def test_a_bad_columns_message_is_refused_with_its_reason(change, reason: str) -> None:
    with pytest.raises(DecodeError) as refused:
        decode_features(_altered(change))
    assert refused.value.reason.startswith("invalid FeatureColumns: ")
    assert reason in refused.value.reason


def test_only_worker_events_are_packed() -> None:
    pool_event = _events()[0].model_copy(update={"scope": "pool"})
    with pytest.raises(ValueError, match="worker-scope"):
        pack_feature_events([pool_event], "message-0001", 0)


def test_rows_give_the_engine_the_batch_their_events_give() -> None:
    events = _events()
    rows = FeatureBatch.from_rows(decode_features(_wire(events)))
    single = FeatureBatch.from_events(events)
    assert rows.targets == single.targets and rows.pools == single.pools
    assert rows.event_times_ms.tolist() == single.event_times_ms.tolist()
    for name in single.features:
        np.testing.assert_array_equal(rows.features[name], single.features[name])
    assert [rows.event(i) for i in range(3)] == events


def test_concat_keeps_the_order_and_fills_missing_features_with_nan() -> None:
    events = _events()
    first, second = FeatureBatch.from_events(events[:1]), FeatureBatch.from_rows(
        decode_features(_wire(events[1:])))
    both = FeatureBatch.concat([first, second])
    assert both.targets == ["j|w0", "j|w1", "j|w2"]
    assert both.features["a"][0] == 1.0 and np.isnan(both.features["a"][1:]).all()
    assert [both.event(i) for i in range(3)] == events


def _agent(max_rows_per_step: int = 20_000) -> PolicyAgent:
    registry = PolicyRegistry(VERIFIER)
    for policy in load_builtin_policies():
        registry.install_trusted(policy)
    return PolicyAgent(TOPICS, registry, {}, {}, KEYRING,
                       max_rows_per_step=max_rows_per_step)


@pytest.mark.parametrize("max_rows_per_step", [20_000, 3])
def test_the_engine_commands_alike_from_columns_and_from_single_events(
        max_rows_per_step: int) -> None:
    workers = [WorkerIdentity(job_id="j", worker_id=f"w{i}", node_id=f"n{i // 4}")
               for i in range(12)]
    # in steps of 3 rows at most, a message of 5 is a step of its own
    singles, packed = _agent(), _agent(max_rows_per_step)
    outcomes: dict[str, list] = {"singles": [], "packed": []}
    for step in range(6):
        events = [FeatureEvent(event_id=f"f-{w.worker_id}-{step:04d}", identity=w,
                               event_time_ms=1_000_000 + step * 5_000,
                               features={**HEALTHY, **STUCK} if i % 3 == 0 else HEALTHY,
                               tags={"episode_end_reason": "collision"})
                  for i, w in enumerate(workers)]
        one_by_one = [Record(TOPICS.features, 0, step * 100 + i, b"k", encode(event))
                      for i, event in enumerate(events)]
        # two messages of columns with a single event between them
        columns = [Record(TOPICS.features, 0, step * 100, b"k", _wire(events[:5])),
                   one_by_one[5],
                   Record(TOPICS.features, 0, step * 100 + 1, b"k", _wire(events[6:]))]
        for name, agent, records in (("singles", singles, one_by_one),
                                     ("packed", packed, columns)):
            out = agent.process(records)
            # message ids are new each time, and signatures cover them
            outcomes[name] += [(m.topic, m.key, m.event.model_dump(
                exclude={"event_id", "signature", "signed_by"})) for m in out.messages]
    if max_rows_per_step == 20_000:
        assert outcomes["packed"] == outcomes["singles"]
    else:  # the same messages; a step's commands come before the next step's
        assert sorted(map(repr, outcomes["packed"])) == sorted(map(repr, outcomes["singles"]))
    assert any(topic == TOPICS.actuations for topic, _key, _event in outcomes["packed"])
    assert packed.counters.features_in == singles.counters.features_in == 72


def test_the_metrics_job_sends_one_message_per_partition_each_row_where_its_worker_goes() -> None:
    partitions = 3

    def partition_of(key: bytes) -> int:
        return (murmur2(key) & 0x7FFFFFFF) % partitions

    job = MetricsJob(TOPICS, {}, feature_partition=partition_of, feature_rows_per_message=4)
    records = []
    for index in range(10):
        worker = TraceIdentity(worker_id=f"worker-{index:03d}", gpu_uuid=f"GPU-{index}")
        for offset, batch in enumerate(grad_norm_decay(worker, -0.01, steps=10)[:1]):
            records.append(Record(TOPICS.metrics, 0, index * 10 + offset,
                                  worker.worker_id.encode(), encode(batch)))
    result = job.process(records, max(orjson.loads(r.value)["event_time_ms"]
                                      for r in records) + 1_000)
    assert len(result.features) == 10
    seen = []
    for output in result.feature_columns:
        rows = feature_events(output.value())
        assert 1 <= len(rows) <= 4
        assert {partition_of(e.identity.worker_id.encode()) for e in rows} == {
            partition_of(output.key)}
        seen += rows
    assert sorted(seen, key=lambda e: e.event_id) == sorted(result.features,
                                                            key=lambda e: e.event_id)
    by_partition = {partition_of(e.identity.worker_id.encode()) for e in seen}
    assert len(result.feature_columns) == sum(
        -(-sum(1 for e in seen if partition_of(e.identity.worker_id.encode()) == p) // 4)
        for p in by_partition)


def test_a_message_that_would_pass_the_size_bound_is_split_in_order() -> None:
    tags = {f"label_{n:02d}": "x" * 128 for n in range(30)}
    events = [FeatureEvent(event_id=f"feature-{i:04d}", event_time_ms=1_000,
                           identity=WorkerIdentity(job_id="j", worker_id="w", node_id="n"),
                           features={"a": float(i)}, tags=tags)
              for i in range(300)]  # about 1.2 MB as one message
    outputs = MetricsJob(TOPICS, {}).feature_columns(events)
    assert len(outputs) > 1
    assert all(len(output.value()) <= FEATURE_MESSAGE_MAX_BYTES for output in outputs)
    assert [e for output in outputs for e in feature_events(output.value())] == events


def test_empty_labels_come_back_empty_not_absent() -> None:
    event = FeatureEvent(event_id="feature-0009", event_time_ms=1,
                         identity=WorkerIdentity(job_id="j", worker_id="w", node_id="n",
                                                 labels={}), features={"a": 1.0})
    (back,) = feature_events(_wire([event]))
    assert back == event and encode(back) == encode(event)


def test_a_step_never_holds_more_rows_than_its_bound_but_for_one_larger_message() -> None:
    from dsec.policy_engine.policy_agent import _Pending

    events = _events()
    rows = decode_features(_wire(events))  # 3 rows
    pending = _Pending(max_rows=3)
    assert [len(step) for step in pending.add(rows)] == [3]  # full: out at once
    assert pending.add(events[0]) == []
    assert [len(step) for step in pending.add(rows)] == [1, 3]
    big = _Pending(max_rows=2)
    assert [len(step) for step in big.add(events[0])] == []
    assert [len(step) for step in big.add(rows)] == [1, 3]  # the larger message alone
    assert [len(step) for step in big.add(events[1]) + big.finish()] == [1]
