"""The probe put together, against a transport that records what it is given and a clock
the test moves."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from recording import RecordingTransport
from recording import manual_probe as _probe

from dsec.ingest import Probe
from dsec.ingest.clock import ManualClock, SystemClock
from dsec.ingest.flush_thread import URGENT_GAP_S


def test_samples_become_one_valid_batch_per_flush() -> None:
    transport = RecordingTransport()
    probe = _probe(transport)
    for index in range(5):
        probe.record_episode(float(index), 10 + index, termination_reason="pole_fell")
    probe.record_step(loss=0.25, grad_norm=2.0)
    probe.flush()
    probe.flush()  # nothing new: no empty message
    batches = transport.batches()
    assert len(batches) == 1
    kinds = [s.kind for s in batches[0].rows()]
    assert kinds.count("episode") == 5 and kinds.count("step") == 1
    assert transport.messages[0][1] == b"w0"  # keyed by worker
    transport.poll()
    assert probe.counters().samples_sent == 6


def test_full_buffer_drops_are_counted_exactly_and_reported() -> None:
    transport = RecordingTransport()
    transport.accepting = False
    clock = ManualClock()
    probe = _probe(transport, clock, buffer_max_samples=10)
    for index in range(25):
        probe.record_episode(float(index), 1)
    probe.flush()  # refused: kept in the buffer
    counters = probe.counters()
    assert counters.samples_dropped == 15
    assert counters.samples_buffered == 10
    transport.accepting = True
    clock.advance(probe.config.heartbeat_interval_s)  # a heartbeat is due
    probe.flush()
    transport.poll()
    samples = [s for batch in transport.batches() for s in batch.rows()]
    heartbeat = next(s for s in samples if s.kind == "heartbeat")
    assert heartbeat.samples_dropped == 15
    assert sum(1 for s in samples if s.kind == "episode") == 10
    assert [s.reward for s in samples if s.kind == "episode"] == [float(i) for i in range(10)]


def test_failed_deliveries_count_as_dropped() -> None:
    transport = RecordingTransport()
    transport.deliver = False
    probe = _probe(transport)
    probe.record_episode(1.0, 1)
    probe.record_episode(2.0, 1)
    probe.flush()
    transport.poll()
    counters = probe.counters()
    assert counters.samples_dropped == 2 and counters.messages_failed == 1
    assert counters.samples_buffered == 0


def test_watched_optimizer_reports_grad_norm_and_nonfinite_loss() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    transport = RecordingTransport()
    probe = _probe(transport, grad_norm_every_n_steps=1)
    probe.watch(optimizer)
    expected_norms = []
    for step in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        expected_norms.append(float(torch.linalg.vector_norm(
            torch.stack([g.norm() for g in grads]))))
        probe.note_loss(loss if step < 2 else loss * float("nan"))
        optimizer.step()
    probe.flush()
    steps = [s for s in transport.batches()[0].rows() if s.kind == "step"]
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.grad_norm for s in steps] == pytest.approx(expected_norms, rel=1e-5)
    assert steps[2].loss is None and steps[2].loss_nonfinite
    assert steps[0].loss is not None and not steps[0].loss_nonfinite
    probe.shutdown()


def test_grad_norm_sampling_every_n_steps() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    transport = RecordingTransport()
    probe = _probe(transport, grad_norm_every_n_steps=2)
    probe.watch(optimizer)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    probe.flush()
    norms = [s.grad_norm for s in transport.batches()[0].rows() if s.kind == "step"]
    assert [n is not None for n in norms] == [True, False, True, False]


def test_step_callbacks_run_on_the_caller_thread_and_never_raise() -> None:
    probe = _probe(RecordingTransport())
    seen = []
    probe.add_step_callback(lambda: seen.append(threading.get_ident()))
    probe.add_step_callback(lambda: 1 / 0)
    probe.wake()
    probe.record_step()
    probe.wake()
    probe.record_episode(1.0, 1)
    assert seen == [threading.get_ident()] * 2


def test_step_callbacks_wait_for_a_wake_and_cost_the_steps_between_nothing() -> None:
    probe = _probe(RecordingTransport(), step_sample_every_n_steps=100,
                   grad_norm_every_n_steps=100)
    runs = []
    probe.add_step_callback(lambda: runs.append(probe.global_step))
    for _ in range(5):
        probe.record_step()
    probe.record_episode(1.0, 1)
    assert runs == []  # samples and episodes alone do not run them
    waker = threading.Thread(target=probe.wake)  # as a command's arrival does
    waker.start()
    waker.join()
    probe.record_step()
    probe.record_step()
    assert runs == [6]  # the first boundary after the wake, once
    probe.flush()  # the flusher wakes them once a flush interval
    probe.record_episode(1.0, 1)
    assert runs == [6, 7]


def test_a_nonfinite_loss_between_samples_is_reported_when_every_loss_is_checked() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    transport = RecordingTransport()
    probe = _probe(transport, step_sample_every_n_steps=10, grad_norm_every_n_steps=10,
                   loss_check_every_step=True)
    probe.watch(optimizer)
    for step in range(12):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        # a loss that overflowed once, its gradients finite
        probe.note_loss(loss * float("nan") if step == 3 else loss)
        optimizer.step()
    probe.flush()
    steps = {s.step: s for s in transport.samples("step")}
    assert sorted(steps) == [0, 3, 10]  # step 3 was not due: the flusher read its NaN
    assert steps[3].loss_nonfinite and steps[3].grad_norm is None
    assert not steps[10].loss_nonfinite and steps[10].loss is not None
    probe.shutdown()


def test_by_default_loss_tensors_between_samples_are_not_read_but_numbers_are() -> None:
    transport = RecordingTransport()
    probe = _probe(transport, step_sample_every_n_steps=10, grad_norm_every_n_steps=10)
    nan = float("nan")
    for step in range(12):
        loss = {3: torch.tensor(nan), 5: nan, 10: torch.tensor(nan)}.get(step, 0.5)
        probe.record_step(loss=loss)
    probe.flush()
    steps = {s.step: s for s in transport.samples("step")}
    # the tensor at 3 is not read (no device read on the training thread); the number at 5
    # makes its step a sample; the tensor at 10 is a sample's and is read by the flusher
    assert sorted(steps) == [0, 5, 10] and steps[5].loss_nonfinite and steps[10].loss_nonfinite
    assert not steps[0].loss_nonfinite


def _watched_steps(probe: Probe, steps: int, noted, wake_at: int | None = None) -> None:
    """``steps`` steps of a small model under ``probe.watch``; ``noted(step, loss)`` is what
    each step hands to ``note_loss``, and the step ``wake_at`` is woken first."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe.watch(optimizer)
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        if step == wake_at:
            probe.wake()
        probe.note_loss(noted(step, loss))
        optimizer.step()


def test_a_nonfinite_number_noted_between_samples_makes_a_sample_with_its_norm() -> None:
    transport = RecordingTransport()
    probe = _probe(transport, step_sample_every_n_steps=10, grad_norm_every_n_steps=10)
    _watched_steps(probe, 12, lambda step, loss: float("inf") if step == 4 else loss)
    probe.flush()
    steps = {s.step: s for s in transport.samples("step")}
    assert sorted(steps) == [0, 4, 10]
    assert steps[4].loss_nonfinite and steps[4].grad_norm is not None


def test_a_nonfinite_number_on_a_step_right_after_a_wake_is_still_a_sample() -> None:
    """A wake takes the next step off the fast path without making it due for a sample;
    a NaN handed over as a number on that step must not go unreported."""
    transport = RecordingTransport()
    watched = _probe(transport, step_sample_every_n_steps=10, grad_norm_every_n_steps=10)
    _watched_steps(watched, 6, lambda step, _loss: float("nan") if step == 4 else 0.5, wake_at=4)
    unwatched_transport = RecordingTransport()
    unwatched = _probe(unwatched_transport, step_sample_every_n_steps=10)
    for step in range(6):
        if step == 4:
            unwatched.wake()
        unwatched.record_step(loss=float("nan") if step == 4 else 0.5)
    for probe, recorded in ((watched, transport), (unwatched, unwatched_transport)):
        probe.flush()
        steps = {s.step: s for s in recorded.samples("step")}
        assert sorted(steps) == [0, 4]
        assert steps[4].loss_nonfinite


def test_a_nonfinite_loss_of_an_unwatched_loop_between_samples_is_reported_when_asked() -> None:
    transport = RecordingTransport()
    probe = _probe(transport, step_sample_every_n_steps=10, grad_norm_every_n_steps=10,
                   loss_check_every_step=True)
    for step in range(12):
        probe.record_step(loss=float("nan") if step == 3 else 0.5)  # dsec.report_step(loss)
    probe.record_step(loss=torch.tensor(float("inf")))
    probe.flush()
    steps = {s.step: s for s in transport.samples("step")}
    assert sorted(steps) == [0, 3, 10, 12]  # 3 and 12 were not due: their losses made them
    assert steps[3].loss_nonfinite and steps[12].loss_nonfinite
    assert not steps[10].loss_nonfinite and steps[10].loss == 0.5
    probe.shutdown()


def test_a_nonfinite_sample_is_sent_at_once_and_a_nan_storm_is_not_a_message_per_step() -> None:
    """Routine samples wait for the flush interval (60 s here); a NaN/Inf one is sent
    without waiting, and a loss that is NaN on every step gets at most one early flush per
    ``URGENT_GAP_S``."""
    transport = RecordingTransport()
    probe = _probe(transport, SystemClock(), step_sample_every_n_steps=10)  # a real thread
    probe.start()
    try:
        for _ in range(5):
            probe.record_step(loss=0.5)
        assert not transport.wait_for_messages(1, timeout_s=0.1)  # routine: waits
        probe.record_step(loss=float("nan"))
        assert transport.wait_for_messages(1, timeout_s=5)
        assert any(s.loss_nonfinite for s in transport.samples("step"))
        sent = len(transport.messages)
        started_s = time.monotonic()
        for _ in range(150):  # a NaN every step, a step every 1 ms or more
            probe.record_step(loss=float("inf"))
            time.sleep(0.001)
        elapsed_s = time.monotonic() - started_s
        assert transport.wait_for_messages(sent + 1, timeout_s=5)
        early = len(transport.messages) - sent
        assert early <= elapsed_s / URGENT_GAP_S + 2
    finally:
        probe.shutdown()
    steps = transport.samples("step")
    assert sum(s.loss_nonfinite for s in steps) >= 100  # every NaN step was a sample


def test_closing_the_kafka_transport_reports_what_it_held_as_not_delivered() -> None:
    """A closed transport leaves no client behind reconnecting to a broker that is gone."""
    from dsec.ingest.transport import KafkaTransport

    transport = KafkaTransport({"bootstrap.servers": "127.0.0.1:1", "enable.idempotence": True,
                                "acks": "all"})
    reports: list[tuple[bool, str]] = []
    assert transport.send("metrics", b"w0", b"{}", lambda ok, error: reports.append((ok, error)))
    transport.close()
    transport.close()  # twice is harmless
    assert len(reports) == 1 and reports[0][0] is False
