"""Torch-side signals: trainer-given norms, NaN flags, gradient-sync timing, CUDA memory math,
the step scope, heartbeat accounting and configuration precedence."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from recording import RecordingTransport, manual_probe

from dsec.ingest import ProbeConfig
from dsec.ingest.clock import ManualClock
from dsec.ingest.cuda_memory import CudaMemoryCollector, fragmentation_ratio, memory_fields
from dsec.ingest.grad_sync import GradSyncTimer, instrument_all_reduce, timed_comm_hook
from dsec.ingest.loop import StepScope


def _train_steps(probe, optimizer, model, steps: int, clip: float | None = None) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        if clip is not None:
            probe.note_grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        optimizer.step()


def test_norm_from_the_trainer_is_reused_not_recomputed() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport, grad_norm_every_n_steps=1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.watch(optimizer)
    _train_steps(probe, optimizer, model, 2, clip=1e-6)  # clipped: post-clip norm is ~1e-6
    _train_steps(probe, optimizer, model, 1)
    probe.flush()
    steps = transport.samples("step")
    assert [s.grad_norm_source for s in steps] == ["trainer", "trainer", "probe"]
    assert steps[0].grad_norm > 1e-3  # the pre-clip total norm, as clip_grad_norm_ returns it


def test_large_backlog_goes_out_in_bounded_messages() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport, max_samples_per_message=4)
    for index in range(10):
        probe.record_episode(float(index), 1)
    probe.flush()
    assert [len(b.rows()) for b in transport.batches()] == [4, 4, 2]
    transport.poll()
    assert probe.counters().samples_sent == 10


def test_unsendable_chunk_is_counted_and_the_rest_goes_on() -> None:
    class Refusing(RecordingTransport):
        def send(self, topic, key, value, on_delivery) -> bool:
            if not self.messages and not getattr(self, "failed", False):
                self.failed = True
                raise RuntimeError("message too large")
            return super().send(topic, key, value, on_delivery)

    transport = Refusing()
    probe = manual_probe(transport, max_samples_per_message=3)
    for index in range(5):
        probe.record_episode(float(index), 1)
    probe.flush()
    transport.poll()
    counters = probe.counters()
    assert (counters.samples_dropped, counters.samples_sent, counters.messages_failed) == (3, 2, 1)
    assert counters.samples_buffered == 0


def test_nonfinite_gradients_are_flagged() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport, grad_norm_every_n_steps=1)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.watch(optimizer)
    optimizer.zero_grad()
    (model(torch.randn(2, 3)).sum() * float("inf")).backward()
    optimizer.step()
    probe.flush()
    (step,) = transport.samples("step")
    assert step.grad_nonfinite and step.grad_norm is None


def test_heartbeat_accounts_for_every_sample_itself_included() -> None:
    transport = RecordingTransport()
    transport.accepting = False
    clock = ManualClock()
    probe = manual_probe(transport, clock, buffer_max_samples=5)
    for index in range(8):
        probe.record_episode(float(index), 1)
    clock.advance(probe.config.heartbeat_interval_s)
    probe.flush()  # full: the heartbeat is dropped, and counted
    counters = probe.counters()
    assert counters.samples_recorded == 9
    assert counters.samples_dropped == 4 and counters.samples_buffered == 5
    transport.accepting = True
    clock.advance(probe.config.heartbeat_interval_s)
    probe.flush()
    transport.poll()
    counters = probe.counters()
    assert counters.samples_recorded == counters.samples_sent + counters.samples_dropped
    heartbeat = transport.samples("heartbeat")[-1]
    assert heartbeat.samples_recorded == 10 and heartbeat.samples_dropped == 4


class _Sink:
    global_step = 7

    def __init__(self) -> None:
        self.syncs: list[tuple] = []

    def record_grad_sync(self, step, nbytes, latency_ms, ok, op, timer="wall_clock", error=None):
        self.syncs.append((step, nbytes, latency_ms, ok, op, timer, error))


@pytest.fixture
def gloo_group(tmp_path):
    """A real one-rank gloo process group (the two-rank group is in the end-to-end test)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_all_reduce_is_timed_sync_and_async_and_undone(gloo_group) -> None:
    sink = _Sink()
    original = dist.all_reduce
    undo = instrument_all_reduce(GradSyncTimer(sink))
    try:
        assert instrument_all_reduce(GradSyncTimer(sink))() is None  # never wrapped twice
        tensor = torch.ones(1000)
        dist.all_reduce(tensor)
        dist.all_reduce(torch.ones(10, dtype=torch.float64), async_op=True).wait()
        with pytest.raises(Exception):  # noqa: B017 - whatever gloo raises is re-raised as is
            dist.all_reduce(torch.ones(4), group=object())
    finally:
        undo()
    assert dist.all_reduce is original
    assert [s[1] for s in sink.syncs] == [4000, 80, 16]
    assert all(s[0] == 7 and s[2] >= 0 and s[4] == "all_reduce" and s[5] == "wall_clock"
               for s in sink.syncs)
    assert [s[3] for s in sink.syncs] == [True, True, False]
    assert sink.syncs[2][6]  # the failure says why


def test_ddp_comm_hook_times_buckets_once(gloo_group) -> None:
    sink = _Sink()
    timer = GradSyncTimer(sink)
    undo = instrument_all_reduce(timer)  # the hook's inner all-reduce is not counted twice
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10))
        model.register_comm_hook(None, timed_comm_hook(timer))
        model(torch.randn(4, 10)).sum().backward()
    finally:
        undo()
    assert sink.syncs, "no bucket timed"
    assert {s[4] for s in sink.syncs} == {"ddp_bucket_all_reduce"}
    assert sum(s[1] for s in sink.syncs) == 110 * 4
    assert all(s[3] for s in sink.syncs)


def test_failing_comm_hook_is_recorded_and_raised() -> None:
    sink = _Sink()

    def broken(_state, _bucket):
        raise RuntimeError("link down")

    class Bucket:
        def buffer(self):
            return torch.ones(3)

    with pytest.raises(RuntimeError, match="link down"):
        timed_comm_hook(GradSyncTimer(sink), broken)(None, Bucket())
    assert sink.syncs[0][3] is False and "link down" in sink.syncs[0][6]


@pytest.mark.parametrize(
    ("allocated", "reserved", "expected"),
    [(0, 0, 0.0), (75, 100, 0.25), (100, 100, 0.0), (120, 100, 0.0)],
)
def test_fragmentation_ratio(allocated: int, reserved: int, expected: float) -> None:
    assert fragmentation_ratio(allocated, reserved) == pytest.approx(expected)


def test_cuda_memory_fields_and_collector_without_a_gpu() -> None:
    stats = {"allocated_bytes.all.current": 3 << 30, "reserved_bytes.all.current": 4 << 30,
             "allocated_bytes.all.peak": 5 << 30, "num_ooms": 2, "num_alloc_retries": 1}
    fields = memory_fields(1, stats)
    assert fields["fragmentation_ratio"] == pytest.approx(0.25)
    assert fields["oom_count"] == 2 and fields["peak_allocated_bytes"] == 5 << 30

    transport = RecordingTransport()
    probe = manual_probe(transport)
    collector = CudaMemoryCollector(probe, 0.0, read_stats=lambda _index: stats)
    collector.bind_device()  # no CUDA here: stays unbound, samples nothing
    collector()
    collector._device_index = 1  # as bind_device would on a GPU worker
    collector()
    probe.flush()
    (sample,) = transport.samples("cuda_memory")
    assert sample.device_index == 1 and sample.reserved_bytes == 4 << 30


def test_step_scope_records_once_with_or_without_a_watched_optimizer() -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport, grad_norm_every_n_steps=1)
    with StepScope(lambda: probe) as step:
        step.note_loss(0.5)

    @StepScope(lambda: probe)
    def train_step() -> torch.Tensor:
        return torch.tensor(0.25)

    train_step()
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.watch(optimizer)
    with StepScope(lambda: probe) as step:
        loss = model(torch.randn(2, 3)).sum()
        loss.backward()
        step.note_loss(loss)
        optimizer.step()
    with pytest.raises(ValueError), StepScope(lambda: probe):
        raise ValueError("bad batch")
    probe.flush()
    steps = transport.samples("step")
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.loss for s in steps[:2]] == [0.5, 0.25]
    assert steps[2].loss == pytest.approx(float(loss.detach())) and steps[2].grad_norm is not None


def test_config_precedence_argument_then_environment_then_default(monkeypatch) -> None:
    monkeypatch.setenv("DSEC_PROBE_FLUSH_INTERVAL_S", "0.5")
    monkeypatch.setenv("DSEC_PROBE_GPU_INDICES", "[0, 2]")
    assert ProbeConfig().flush_interval_s == 0.5
    assert ProbeConfig().gpu_indices == (0, 2)
    assert ProbeConfig(flush_interval_s=0.2).flush_interval_s == 0.2
    assert ProbeConfig().heartbeat_interval_s == 5.0
    monkeypatch.setenv("DSEC_PROBE_GRAD_NORM_EVERY_N_STEPS", "0")
    with pytest.raises(ValueError, match="grad_norm_every_n_steps"):
        ProbeConfig()


def test_default_sampling_records_every_tenth_step_with_its_mean_step_time() -> None:
    transport = RecordingTransport()
    clock = ManualClock()
    probe = manual_probe(transport, clock, step_sample_every_n_steps=10,
                         grad_norm_every_n_steps=10)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.watch(optimizer)
    for _ in range(25):
        optimizer.zero_grad()
        loss = model(torch.randn(2, 3)).sum()
        loss.backward()
        probe.note_loss(loss)
        clock.advance(0.003)
        optimizer.step()
    probe.flush()
    steps = transport.samples("step")
    assert [s.step for s in steps] == [0, 10, 20] and probe.global_step == 25
    assert all(s.grad_norm is not None and s.loss is not None for s in steps)
    assert steps[0].step_time_ms is None
    assert [s.step_time_ms for s in steps[1:]] == pytest.approx([3.0, 3.0])


def test_gradients_the_norm_cannot_read_never_break_the_step(monkeypatch) -> None:
    transport = RecordingTransport()
    probe = manual_probe(transport, grad_norm_every_n_steps=1)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.watch(optimizer)
    before = model.weight.detach().clone()

    def unreadable(_tensors):
        raise RuntimeError("no fused norm for these gradients")

    monkeypatch.setattr(torch, "_foreach_norm", unreadable)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    probe.flush()
    (step,) = transport.samples("step")
    assert step.grad_norm is None and probe.global_step == 1
    assert not torch.equal(model.weight, before)  # the step itself happened


def test_sb3_callback_without_the_extra_says_how_to_install(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    monkeypatch.setitem(sys.modules, "stable_baselines3.common", None)
    monkeypatch.setitem(sys.modules, "stable_baselines3.common.callbacks", None)
    monkeypatch.delitem(sys.modules, "dsec.ingest.sb3", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'dsec\[sb3\]'"):
        import dsec.ingest.sb3  # noqa: F401
