"""Snapshot chains on disk: bit-exact restore, detected corruption, quantised error bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dsec.actuators.restore import NoSnapshotError, restore
from dsec.actuators.snapshot_store import list_sequences, pack_path, read_manifest
from dsec.actuators.snapshotter import SnapshotConfig, Snapshotter


def _model_and_optimizer(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 8))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _snapshot_chain(directory: Path, snapshots: int, **config: object):
    model, optimizer = _model_and_optimizer()
    config = {"delta_budget": 100.0, **config}
    snapshotter = Snapshotter(model, optimizer,
                              SnapshotConfig(directory=directory, chunk_bytes=8192, **config))
    for step in range(snapshots):
        _train_step(model, optimizer)
        assert snapshotter.request(step, {"episode_head": 10 * step}) is not None
        assert snapshotter.wait_idle(30)
    snapshotter.close()
    assert snapshotter.stats.failed == 0
    return model, optimizer, snapshotter


def test_chain_restores_bit_exact_state_and_rng(tmp_path: Path) -> None:
    model, optimizer, _ = _snapshot_chain(tmp_path, 5)
    manifests = [read_manifest(tmp_path, seq) for seq in list_sequences(tmp_path)]
    assert [m.parent for m in manifests] == [None, 0, 1, 2, 3]
    expected_next = torch.rand(3)  # the RNG draw right after the last snapshot

    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    state = restore(f"file://{tmp_path}", fresh, fresh_optimizer)
    assert state.seq == 4 and state.global_step == 4 and state.meta["episode_head"] == 40
    assert state.report.corrupt == []
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    for index, values in optimizer.state_dict()["state"].items():
        restored = fresh_optimizer.state_dict()["state"][index]
        for key, value in values.items():
            assert torch.equal(restored[key], value), (index, key)
    assert torch.equal(torch.rand(3), expected_next)
    _train_step(fresh, fresh_optimizer)  # the restored optimizer keeps training


def test_corrupt_chunk_is_reported_and_last_good_state_used(tmp_path: Path) -> None:
    _snapshot_chain(tmp_path, 4)
    pack = pack_path(tmp_path, 2)
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    state = restore(tmp_path, restore_rng=False)
    assert state.seq == 1
    assert [seq for seq, _ in state.report.corrupt] == [2]


def test_corrupt_newest_link_or_keyframe_falls_back(tmp_path: Path) -> None:
    _snapshot_chain(tmp_path, 5, keyframe_every=3, keep_segments=2)  # keyframes 0 and 3
    newest = pack_path(tmp_path, 4)
    newest.write_bytes(newest.read_bytes()[:-1] + b"\x00")
    state = restore(tmp_path, restore_rng=False)
    assert state.seq == 3 and [seq for seq, _ in state.report.corrupt] == [4]
    keyframe = pack_path(tmp_path, 3)
    data = bytearray(keyframe.read_bytes())
    data[100] ^= 0x01
    keyframe.write_bytes(bytes(data))
    state = restore(tmp_path, restore_rng=False)
    assert state.seq == 2  # the segment before, intact
    assert {seq for seq, _ in state.report.corrupt} == {3, 4}


def test_unchanged_chunks_are_references_not_bytes(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    model[0].weight.requires_grad_(False)  # a frozen layer: Adam never touches it
    snapshotter = Snapshotter(model, optimizer,
                              SnapshotConfig(directory=tmp_path, chunk_bytes=8192))
    for step in range(3):
        _train_step(model, optimizer)
        snapshotter.request(step)
        snapshotter.wait_idle(30)
    snapshotter.close()
    last = read_manifest(tmp_path, 2)
    assert last.keyframe == 0
    frozen = next(t for t in last.tensors if t.name == "model.0.weight")
    trained = next(t for t in last.tensors if t.name == "model.2.weight")
    assert {chunk.stored_in for chunk in frozen.chunks} == {0}
    assert {chunk.stored_in for chunk in trained.chunks} == {2}
    assert {chunk.mode for chunk in trained.chunks} <= {"xor", "key"}
    restored, _ = _model_and_optimizer(seed=3)
    restore(tmp_path, restored, restore_rng=False)
    assert torch.equal(restored[0].weight, model[0].weight)
    assert torch.equal(restored[2].weight, model[2].weight)


def test_new_keyframe_starts_a_segment_and_old_segments_are_pruned(tmp_path: Path) -> None:
    _snapshot_chain(tmp_path, 7, keyframe_every=2, keep_segments=2)
    sequences = list_sequences(tmp_path)
    assert sequences == [4, 5, 6]
    assert read_manifest(tmp_path, 4).parent is None
    assert restore(tmp_path, restore_rng=False).seq == 6


def test_quantised_weights_stay_within_recorded_error(tmp_path: Path) -> None:
    model, _, _ = _snapshot_chain(tmp_path, 2, quantise_weights=True, quantise_block_elems=256)
    state = restore(tmp_path, restore_rng=False)
    weight = model.state_dict()["0.weight"]
    bound = state.max_abs_error["model.0.weight"]
    assert 0 < bound < 1e-2
    assert (state.tensors["model.0.weight"] - weight).abs().max().item() <= bound + 1e-7


def test_empty_directory_has_nothing_to_restore(tmp_path: Path) -> None:
    with pytest.raises(NoSnapshotError):
        restore(tmp_path)
    with pytest.raises(ValueError):
        restore("s3://bucket/path")


def test_busy_snapshotter_skips_instead_of_queueing(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    snapshotter = Snapshotter(model, optimizer, SnapshotConfig(directory=tmp_path))
    first = snapshotter.request(0)
    second = snapshotter.request(0)
    snapshotter.close()
    assert first == 0
    assert second is None or snapshotter.stats.skipped_busy == 0
    assert np.isfinite(snapshotter.stats.blocking_ms_total)


def test_quantised_adam_moments_restore_within_bounds_and_keep_training(tmp_path: Path) -> None:
    _, optimizer, _ = _snapshot_chain(tmp_path, 3, quantise_weights=True,
                                          quantise_optimizer=True, quantise_block_elems=256)
    fresh, fresh_optimizer = _model_and_optimizer(seed=2)
    state = restore(tmp_path, fresh, fresh_optimizer, restore_rng=False)
    for index, values in optimizer.state_dict()["state"].items():
        restored = fresh_optimizer.state_dict()["state"][index]
        assert torch.equal(restored["step"], values["step"])
        if values["exp_avg"].numel() < 1024:
            continue  # small tensors are stored exactly
        bound = state.max_abs_error[f"optim.{index}.exp_avg_sq"]
        root_error = (restored["exp_avg_sq"].sqrt() - values["exp_avg_sq"].sqrt()).abs().max()
        assert root_error.item() <= bound + 1e-7
        assert (restored["exp_avg"] - values["exp_avg"]).abs().max().item() <= (
            state.max_abs_error[f"optim.{index}.exp_avg"] + 1e-7)
    _train_step(fresh, fresh_optimizer)
    assert all(torch.isfinite(p).all() for p in fresh.parameters())


def test_delta_chunks_are_xored_when_that_pays_and_stored_alone_when_not(
        tmp_path: Path) -> None:
    model, _, _ = _snapshot_chain(tmp_path, 3, xor_worth_ratio=1e9)  # XOR always accepted
    assert {c.mode for t in read_manifest(tmp_path, 2).tensors for c in t.chunks
            if c.stored_in == 2} == {"xor"}
    state = restore(tmp_path, restore_rng=False)
    assert state.seq == 2
    assert all(torch.equal(state.model_state()[k], v) for k, v in model.state_dict().items())
    other = tmp_path / "never"
    _snapshot_chain(other, 3, xor_worth_ratio=0.0)  # XOR never worth it
    assert {c.mode for t in read_manifest(other, 2).tensors for c in t.chunks} == {"key"}
    assert restore(other, restore_rng=False).seq == 2


def test_snapshot_bench_reports_every_field(tmp_path: Path) -> None:
    from dsec.bench.snapshot import SnapshotBenchOptions, run_snapshot_bench

    result = run_snapshot_bench(SnapshotBenchOptions(
        hidden=64, steps=6, full_checkpoints=1, directory=tmp_path))
    for key in ("torch_save_blocking_ms", "snapshot_blocking_ms", "blocking_ratio",
                "full_bytes", "incremental_bytes_mean", "size_ratio", "restore_ms"):
        assert result[key] >= 0, key
    assert result["snapshots"] == 3


def test_snapshot_bench_headline_is_the_minimal_state_beside_the_full_one(tmp_path: Path) -> None:
    from dsec.bench.snapshot import run_side_by_side

    result = run_side_by_side(steps=6, snapshot_every_steps=2, directory=tmp_path, hidden=256)
    assert result["quantised_weights"] and not result["optimizer_state"]
    full = result["full_state_lossless"]
    assert full["snapshots"] == result["snapshots"] == 3
    # Without the moments and with int8 weights a snapshot is several times smaller.
    assert result["incremental_bytes_mean"] * 4 < full["incremental_bytes_mean"]


def test_a_snapshot_is_written_at_the_commands_compression_level(tmp_path: Path) -> None:
    from dsec.actuators.snapshot_codec import ChunkCodec
    from dsec.actuators.snapshot_trigger import SnapshotTrigger
    from dsec.schemas.actuations import SnapshotParams

    model, optimizer = _model_and_optimizer()
    snapshotter = Snapshotter(model, optimizer, SnapshotConfig(directory=tmp_path,
                                                               chunk_bytes=8192))
    trigger = SnapshotTrigger(lambda: 3)
    trigger.attach(snapshotter)
    for params in (SnapshotParams(compression_level=19), SnapshotParams()):
        trigger.apply(params)
        assert snapshotter.wait_idle(30)
        _train_step(model, optimizer)
    snapshotter.close()
    raised, default = (read_manifest(tmp_path, seq) for seq in list_sequences(tmp_path))
    assert raised.meta["compression_level"] == 19 and default.meta["compression_level"] == 3
    # the keyframe's bytes are what zstd level 19 makes of its chunks, not level 3
    chunk = max((c for t in raised.tensors if t.dtype == "float32" for c in t.chunks),
                key=lambda c: c.nbytes)
    pack = pack_path(tmp_path, raised.seq).read_bytes()
    stored = pack[chunk.offset:chunk.offset + chunk.length]
    raw = ChunkCodec().decode(stored, None, 4, chunk.nbytes)
    assert ChunkCodec(19).encode(raw, None, 4) == stored != ChunkCodec(3).encode(raw, None, 4)
    assert restore(f"file://{tmp_path}", *_model_and_optimizer(seed=1)).seq == default.seq


def test_a_restore_after_init_reports_the_resume(tmp_path: Path, monkeypatch) -> None:
    from recording import IDENTITY, RecordingTransport

    import dsec
    from dsec import facade
    from dsec.runtime import WorkerRuntime
    from dsec.schemas.settings import DsecSettings

    _snapshot_chain(tmp_path / "chain", 3)
    transport = RecordingTransport()
    runtime = WorkerRuntime(DsecSettings(data_dir=tmp_path / "dsec"), IDENTITY,
                            actuate=False, transport=transport)
    monkeypatch.setattr(facade, "_runtime", runtime)
    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    try:
        dsec.restore(f"file://{tmp_path / 'chain'}", fresh, fresh_optimizer)
        dsec.restore(f"file://{tmp_path / 'chain'}", fresh, fresh_optimizer, report=False)
        dsec.report_resume("checkpoint", 4.5, step=7)
        runtime.probe.flush()
    finally:
        runtime.shutdown()  # undoes its hooks (all_reduce among them) for the tests after it
    recoveries = transport.samples("recovery")
    assert [(r.source, r.step) for r in recoveries] == [("snapshot", 2), ("checkpoint", 7)]
    assert 0 < recoveries[0].recovery_time_s < 30 and recoveries[1].recovery_time_s == 4.5
