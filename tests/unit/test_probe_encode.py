"""The probe's column builders against the general one-dict-per-sample path they replace."""

from __future__ import annotations

import random

import orjson
import pytest
import torch
from recording import RecordingTransport, manual_probe

from dsec.ingest.encode import (
    PACK_MIN_VALUES,
    batch_columns,
    pack_long_columns,
    sample_dict,
)
from dsec.ingest.values import nonfinite_flags
from dsec.schemas import MetricBatch, decode
from dsec.schemas.metrics import columns_from_rows


def _random_batch(rng: random.Random, size: int) -> list[tuple]:
    values = [None, 0.5, 2.0, float("nan"), float("inf"), torch.tensor(1.25),
              torch.tensor(float("nan"))]
    batch: list[tuple] = []
    for index in range(size):
        kind = rng.choice(["step", "step", "episode", "heartbeat", "grad_sync", "fields"])
        time_ms = 1_700_000_000_000 + index
        if kind == "step":
            batch.append(("step", time_ms, index, rng.choice(values), rng.choice(values),
                          rng.choice([None, 2.5]), rng.choice([None, "probe", "trainer"])))
        elif kind == "episode":
            batch.append(("episode", time_ms, index, rng.uniform(-5, 5), rng.randint(1, 500),
                          rng.random() < 0.5, rng.random() < 0.5,
                          rng.choice([None, "pole_fell", "x" * 300])))
        elif kind == "heartbeat":
            batch.append(("heartbeat", time_ms, 5.0, index, 10, 2, 0, 12, 0))
        elif kind == "grad_sync":
            batch.append(("grad_sync", time_ms, index, 4096, 1.5, True, "all_reduce",
                          "wall_clock", rng.choice([None, "timeout"])))
        else:
            batch.append(("fields", time_ms, "cuda_memory",
                          {"device_index": 0, "allocated_bytes": 10, "reserved_bytes": 20}))
    return batch


def _reference(batch: list[tuple]) -> dict[str, dict[str, list]]:
    return columns_from_rows([sample_dict(raw) for raw in batch])


@pytest.mark.parametrize("seed", range(20))
def test_column_builders_match_the_one_dict_per_sample_path(seed: int) -> None:
    batch = _random_batch(random.Random(seed), random.Random(seed).randint(1, 40))
    assert batch_columns(batch) == _reference(batch)


def test_short_columns_stay_lists_and_long_ones_are_packed() -> None:
    batch = [("episode", 1_700_000_000_000, i, 1.0, 10, True, False, None)
             for i in range(PACK_MIN_VALUES)]
    batch.append(("heartbeat", 1_700_000_000_000, 5.0, 0, 0, 0, 0, 0, 0))
    columns = pack_long_columns(batch_columns(batch))
    assert columns["episode"]["reward"]["dtype"] == "<f8"  # packed
    assert columns["heartbeat"]["interval_s"] == [5.0]  # one value: a list


@pytest.mark.parametrize("size", [3, PACK_MIN_VALUES + 5])
def test_probe_messages_validate_and_carry_every_sample(size: int) -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    for index in range(size):
        probe.record_step(loss=torch.tensor(float("nan") if index == 1 else 0.5),
                          grad_norm=torch.tensor(2.0))
        probe.record_episode(float(index), 10)
    probe.flush()
    probe.flush()
    (value,) = [value for _topic, _key, value in transport.messages]
    batch = decode(value, MetricBatch)
    steps = [s for s in batch.rows() if s.kind == "step"]
    assert len(steps) == size and steps[1].loss_nonfinite and steps[0].loss == 0.5
    assert len([s for s in batch.rows() if s.kind == "episode"]) == size
    assert orjson.loads(value)["identity"]["worker_id"] == "w0"


def test_message_ids_are_distinct_and_share_the_probe_prefix() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport)
    for _ in range(3):
        probe.record_step(loss=0.5)
        probe.flush()
    ids = [orjson.loads(value)["event_id"] for _topic, _key, value in transport.messages]
    assert len(set(ids)) == 3 and len({event_id[:16] for event_id in ids}) == 1
    assert all(len(event_id) == 32 for event_id in ids)
    other_transport = RecordingTransport()
    other = manual_probe(other_transport)
    other.record_step(loss=0.5)
    other.flush()
    (other_id,) = [orjson.loads(value)["event_id"] for _, _, value in other_transport.messages]
    assert other_id[:16] != ids[0][:16]


def test_nonfinite_flags_of_tensors_numbers_and_mixed_shapes() -> None:
    tensors = [torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(float("-inf"))]
    assert nonfinite_flags(tensors) == [False, True, True]
    mixed = [0.5, float("nan"), torch.tensor([2.0]), torch.tensor(float("inf")), None]
    assert nonfinite_flags(mixed) == [False, True, False, True, False]
    assert nonfinite_flags([torch.tensor(1.0), torch.tensor([1.0, float("nan")])]) == [False, True]
