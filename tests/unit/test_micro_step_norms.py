"""Gradient norms per micro-step while a loop accumulates gradients, and what the stream
job makes of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recording import IDENTITY, RecordingTransport

from dsec.actuators.grad_accumulation import GradAccumulation
from dsec.ingest import Probe, ProbeConfig
from dsec.schemas.frames import batch_frames
from dsec.schemas.metrics import MICRO_STEP
from dsec.stream_jobs.worker_features import FeatureConfig, _steps
from dsec.stream_jobs.worker_state import StepWindow


def _setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, Probe, RecordingTransport]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    transport = RecordingTransport()
    probe = Probe(IDENTITY, "metrics", transport, ProbeConfig(
        flush_interval_s=60, heartbeat_interval_s=3600, step_sample_every_n_steps=1,
        grad_norm_every_n_steps=1))
    probe.watch(optimizer)
    return model, optimizer, probe, transport


def _step_samples(probe: Probe, transport: RecordingTransport) -> list:
    probe.flush()
    return [s for batch in transport.batches() for s in batch.rows() if s.kind == "step"]


def _backward(model: torch.nn.Module, inputs: torch.Tensor, factor: float) -> float:
    """One micro-step; returns the norm of the gradients this backward alone produced."""
    before = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
              for p in model.parameters()]
    (model(inputs).pow(2).mean() * factor).backward()
    return float(torch.linalg.vector_norm(torch.stack([
        torch.linalg.vector_norm(p.grad - b) for p, b in zip(model.parameters(), before,
                                                              strict=True)])))


def test_each_micro_step_reports_its_own_norm_and_the_step_none() -> None:
    model, optimizer, probe, transport = _setup()
    probe.observe_micro_steps(4)
    expected = []
    for factor in (1.0, 50.0, 1.0, 50.0):
        expected.append(_backward(model, torch.randn(4, 8), factor))
    optimizer.step()
    optimizer.zero_grad()
    samples = _step_samples(probe, transport)
    micro = [s for s in samples if s.grad_norm_source == MICRO_STEP]
    assert [s.grad_norm for s in micro] == pytest.approx(expected, rel=1e-5)
    assert {s.step for s in micro} == {0}  # micro-steps of the first step
    (step,) = [s for s in samples if s.grad_norm_source != MICRO_STEP]
    assert step.step == 0 and step.grad_norm is None  # the accumulated norm is not mixed in


def test_back_to_one_micro_step_restores_step_norms_and_unhooks() -> None:
    model, optimizer, probe, transport = _setup()
    probe.observe_micro_steps(2)
    probe.observe_micro_steps(2)  # no change: nothing hooked twice
    probe.observe_micro_steps(1)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    samples = _step_samples(probe, transport)
    assert [s.grad_norm_source for s in samples] == ["probe"]
    assert samples[0].grad_norm is not None


def test_a_nonfinite_micro_step_is_flagged() -> None:
    model, optimizer, probe, transport = _setup()
    probe.observe_micro_steps(2)
    _backward(model, torch.randn(4, 8), 1.0)
    _backward(model, torch.randn(4, 8), float("nan"))
    optimizer.step()
    micro = [s for s in _step_samples(probe, transport) if s.grad_norm_source == MICRO_STEP]
    assert [s.grad_nonfinite for s in micro] == [False, True]


def test_the_accumulation_helper_tells_the_probe() -> None:
    model, optimizer, probe, transport = _setup()
    accumulation = GradAccumulation(steps=2, on_window=probe.observe_micro_steps)
    for _ in range(2):
        with accumulation.micro_step() as sync:
            accumulation.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    samples = _step_samples(probe, transport)
    assert [s.grad_norm_source for s in samples].count(MICRO_STEP) == 2


def test_micro_step_samples_feed_the_norm_window_but_do_not_count_as_steps() -> None:
    model, optimizer, probe, transport = _setup()
    probe.observe_micro_steps(4)
    optimizer.param_groups[0]["lr"] = 0.0  # the same gradients window after window
    inputs = torch.randn(4, 8)
    for _ in range(3):
        for factor in (1.0, 50.0, 1.0, 50.0):  # a loss blowing up on every other micro-step
            _backward(model, inputs, factor)
        optimizer.step()
        optimizer.zero_grad()
    probe.flush()
    (batch,) = transport.batches()
    frame = batch_frames(batch)["step"]
    out: dict[str, float] = {}
    _steps(StepWindow(), frame, FeatureConfig(jump_ratio=20.0), out)
    assert out["steps_total"] == 3.0
    assert out["grad_norm_jumps"] == 11.0  # every pair of the 12 micro-steps swings
    assert np.isfinite(out["grad_norm"])


def test_a_gradient_the_hook_cannot_measure_does_not_fail_the_backward() -> None:
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)
    transport = RecordingTransport()
    probe = Probe(IDENTITY, "metrics", transport, ProbeConfig(
        flush_interval_s=60, heartbeat_interval_s=3600, step_sample_every_n_steps=1))
    probe.watch(optimizer)
    probe.observe_micro_steps(2)
    embedding(torch.tensor([1, 2])).sum().backward()  # must not raise
    optimizer.step()
