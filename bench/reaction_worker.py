"""The training worker of ``dsec bench reaction``: a small torch loop with the probe and the
node channel set up by ``dsec.init``, as in a training script.

Each trial is a fresh ``dsec.init`` under a fresh worker id (no cooldown, hold or
desired state of an earlier trial can hide it): a lead-in of ordinary steps, then one
step whose reported loss is NaN, then ordinary steps until the precision command that
answers it has been applied by the apply hook. The worker does not watch its optimizer
but reports each step with ``dsec.report_step``, so no gradient-norm spike can fire the
policy before the NaN does. One JSON line per trial on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass

import torch

import dsec
from dsec.bench.reaction_figures import TrialRecord
from dsec.schemas.actuations import PrecisionParams


@dataclass(frozen=True)
class WorkerOptions:
    node_id: str
    trials: int
    warmup_trials: int = 1
    timeout_s: float = 10.0
    warmup_timeout_s: float = 120.0
    lead_in_s: float = 0.5
    step_interval_ms: float = 10.0


class _Trainer:
    """A step of a tiny regression, paced to ``step_interval_ms`` (a device would set the
    pace; a busy loop would take the CPU from the stack being measured)."""

    def __init__(self, step_interval_ms: float) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                         torch.nn.Linear(64, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self._interval_s = step_interval_ms / 1000.0
        self._next_s = time.monotonic()

    def step(self, report_nan: bool = False) -> int | None:
        """One step; returns the wall-clock ns the NaN was handed over, when asked for one."""
        inputs = torch.randn(64, 32)
        with dsec.autocast():  # what the precision command switches
            outputs = self.model(inputs)
        loss = (outputs.float() - inputs[:, :1]).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        recorded_ns = None
        if report_nan:
            recorded_ns = time.time_ns()
            dsec.report_step(float("nan"))  # commands are applied inside this call
        else:
            dsec.report_step(loss)
        self._next_s += self._interval_s
        time.sleep(max(0.0, self._next_s - time.monotonic()))
        self._next_s = max(self._next_s, time.monotonic())
        return recorded_ns


def run_trial(trainer: _Trainer, trial: int, warmup: bool, options: WorkerOptions) -> TrialRecord:
    worker_id = f"reaction-{'warmup' if warmup else 'trial'}-{trial:03d}"
    runtime = dsec.init(worker_id=worker_id, node_id=options.node_id)
    flush_interval_s = runtime.probe.config.flush_interval_s
    applied: list[tuple[int, str]] = []
    precision = dsec.controls().precision

    @dsec.on_action(dsec.ActionKind.PRECISION)
    def apply_precision(params: PrecisionParams) -> str:
        applied.append((time.time_ns(), params.dtype))
        return precision.apply(params)

    try:
        # A random share of a flush interval more: else the NaN would meet the probe's
        # flush at the same phase in every trial.
        jitter_s = random.Random(trial).uniform(0.0, flush_interval_s)
        lead_in_until_s = time.monotonic() + options.lead_in_s + jitter_s
        while time.monotonic() < lead_in_until_s:
            trainer.step()
        recorded_ns = trainer.step(report_nan=True)
        assert recorded_ns is not None
        timeout_s = options.warmup_timeout_s if warmup else options.timeout_s
        deadline_s = time.monotonic() + timeout_s
        while not applied and time.monotonic() < deadline_s:
            trainer.step()
    finally:
        dsec.shutdown()
    applied_ns, dtype = applied[0] if applied else (None, None)
    return TrialRecord(trial=trial, worker_id=worker_id, warmup=warmup,
                       recorded_ns=recorded_ns, applied_ns=applied_ns, applied_dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsec.bench.reaction_worker")
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--trials", type=int, required=True)
    parser.add_argument("--warmup-trials", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--warmup-timeout-s", type=float, default=120.0)
    parser.add_argument("--lead-in-s", type=float, default=0.5)
    parser.add_argument("--step-interval-ms", type=float, default=10.0)
    options = WorkerOptions(**vars(parser.parse_args(argv)))
    torch.set_num_threads(1)
    trainer = _Trainer(options.step_interval_ms)
    schedule = [(i, True) for i in range(options.warmup_trials)]
    schedule += [(i, False) for i in range(options.trials)]
    for trial, warmup in schedule:
        record = run_trial(trainer, trial, warmup, options)
        print(json.dumps(asdict(record)), flush=True)
        if warmup and record.applied_ns is None:
            return 1  # the stack never answered: measured trials would only time out
    return 0


if __name__ == "__main__":
    sys.exit(main())
