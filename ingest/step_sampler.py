"""What the training thread records: every episode, and the steps due for a sample.

Most steps only count (the fast path: a compare and an increment); a step is a sample every
``step_sample_interval_steps`` steps, on every step whose gradient norm is taken, and on a
step whose loss is a NaN/Inf number. Step callbacks run at the first step or episode
boundary after a ``wake``. The training thread never waits for a device: a loss tensor is
kept and read by the flusher (``check_losses``), which also asks nothing of this thread.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from dsec.ingest.callbacks import WarnOnce
from dsec.ingest.clock import Clock
from dsec.ingest.config import ProbeConfig
from dsec.ingest.sampling import SpacedWork, smoothed
from dsec.ingest.values import host_value, nonfinite_flags
from dsec.schemas.metrics import MICRO_STEP
from dsec.schemas.units import duration_ms, ms_to_s

# Losses of steps between samples, waiting for the flusher's NaN/Inf check. Beyond this many
# (a flusher held up for seconds on a fast loop) the oldest go unchecked.
LOSS_CHECKS_MAX = 8192

Record = Callable[[tuple], None]


def nonfinite_number(value: Any) -> bool:
    """A NaN/Inf float (a tensor is not read here)."""
    return type(value) is float and value - value != 0.0


class StepSampler:
    def __init__(
        self,
        config: ProbeConfig,
        record: Record,
        clock: Clock,
        flush_soon: Callable[[], None],
        run_callbacks: Callable[[], None],
    ) -> None:
        """``record`` keeps a sample; ``flush_soon`` asks for a flush now (a NaN/Inf
        sample); ``run_callbacks`` runs the step callbacks."""
        # Kept as attributes: the training thread calls them without a lookup through
        # another object.
        self._record = record
        self._monotonic_s = clock.monotonic_s
        self._now_ms = clock.now_ms
        self._flush_soon = flush_soon
        self._run_callbacks = run_callbacks
        self._warn_once = WarnOnce()
        # The fast path's state, read by the optimizer hook inline: steps before
        # ``fast_until_step`` only count. It is the sooner of the next sample and the next
        # norm, or 0 after a ``wake`` or a NaN/Inf float loss.
        self.global_step = 0
        self.fast_until_step = 0
        # While the loop accumulates gradients the micro-steps' norms stand for the step's.
        self.norms_per_micro_step = False
        self._episode_index = 0
        self._last_loss: Any = None
        self._loss_read_s = 0.0  # reading this step's loss, charged to its sample's cost
        self._last_grad_norm: Any = None
        self._grad_norm_from_trainer = False
        self._last_sample_s: float | None = None
        self._last_sample_step = 0
        self._step_time_s: float | None = None  # smoothed, from the step samples
        # (step, loss) of steps between samples, checked for NaN/Inf by the flusher when asked
        self._check_every_loss = config.loss_check_every_step
        self._loss_checks: deque[tuple[int, Any]] = deque(maxlen=LOSS_CHECKS_MAX)
        # steps between two samples and between two norms: fixed, or (adaptive) 10 until
        # their cost is measured
        self._samples = SpacedWork(config.step_sample_budget_fraction,
                                   config.step_sample_max_interval_steps,
                                   config.step_sample_every_n_steps)
        self._norms = SpacedWork(config.grad_norm_budget_fraction,
                                 config.grad_norm_max_interval_steps,
                                 config.grad_norm_every_n_steps)
        self._next_sample_step = 0
        self._next_norm_step = 0
        self._forced_step = -1  # a step made a sample by its NaN/Inf float loss
        self._wake = False  # run the step callbacks at the next step boundary

    @property
    def grad_norm_interval_steps(self) -> int:
        """Steps between two gradient norms, as they are spaced now."""
        return self._norms.interval_steps

    @property
    def step_sample_interval_steps(self) -> int:
        """Steps between two step samples, as they are spaced now."""
        return self._samples.interval_steps

    # --- training thread -------------------------------------------------------------

    def record_episode(
        self,
        reward: float,
        length: int,
        *,
        terminated: bool = True,
        truncated: bool = False,
        termination_reason: str | None = None,
        on_training_thread: bool = True,
    ) -> None:
        """``on_training_thread=False`` from an asynchronous sampling thread: the episode is
        recorded, and the step callbacks (commands among them) wait for the training
        thread's next step boundary."""
        self._record(("episode", self._now_ms(), self._episode_index, reward, length,
                      terminated, truncated, termination_reason))
        self._episode_index += 1
        if self._wake and on_training_thread:
            self.run_step_callbacks()

    def note_loss(self, loss: Any) -> None:
        """Keeps the loss for this step's sample; a tensor is read off the training thread.

        On a step not due for a sample, a loss given as a number is checked (a NaN/Inf one
        makes the step a sample, gradient norm included); a tensor is not read, unless
        ``loss_check_every_step``: then it is queued, and the flusher reads it and records a
        sample for the step when it is NaN/Inf. Either way the training thread never waits
        for a device.
        """
        if isinstance(loss, float) and not math.isfinite(loss):
            self._force(self.global_step)  # on any step: a number costs nothing to check
        elif self.global_step < self.fast_until_step:
            if self._check_every_loss:
                self._loss_checks.append((self.global_step, loss))
            return
        started_s = self._monotonic_s()
        self._last_loss = host_value(loss)
        self._loss_read_s = self._monotonic_s() - started_s

    def note_grad_norm(self, total_norm: Any) -> None:
        """The total gradient norm the trainer already has (``clip_grad_norm_`` returns it):
        used for this step instead of the probe's own."""
        if total_norm is None or not self._due(self.global_step) or self.norms_per_micro_step:
            return
        self._last_grad_norm = host_value(total_norm)
        self._grad_norm_from_trainer = True

    def record_step(self, loss: Any = None, grad_norm: Any = None) -> None:
        """One optimizer step; called by a custom loop (a watched optimizer's hook counts
        its steps itself).

        A sample is recorded every ``step_sample_interval_steps`` steps and on every step whose
        gradient norm is computed; other steps only count (the fast path: a microsecond or
        two, cold caches included) and check a loss given as a number, as ``note_loss``
        does. The sample's step time is the mean since the previous sample.
        """
        step = self.global_step
        self.global_step = step + 1
        if isinstance(loss, float) and not math.isfinite(loss):
            # A number is checked on every step (no device involved), on the fast path or
            # off it (a step right after a wake is off it without being due for a sample).
            self._force(step)
        elif step < self.fast_until_step:
            if loss is not None and self._check_every_loss:
                self._loss_checks.append((step, loss))
            return
        self.step_boundary(step, loss, grad_norm, self._monotonic_s())

    def norm_due(self, step: int) -> bool:
        """Whether the optimizer hook takes the gradient norm of ``step`` (off the fast path)."""
        return ((step >= self._next_norm_step or step == self._forced_step)
                and not self._grad_norm_from_trainer and not self.norms_per_micro_step)

    def took_norm(self, grad_norm: Any, cost_s: float) -> None:
        """The optimizer hook's norm for this step, and what taking it cost."""
        self._last_grad_norm = grad_norm
        self._norms.took(cost_s, self._step_time_s)

    def step_boundary(self, step: int, loss: Any, grad_norm: Any, entered_s: float) -> None:
        """A step off the fast path (since ``entered_s``): its sample when due, the step
        callbacks when woken.

        A sample's cost, which spaces the samples, is all it takes of the training thread:
        the loss read in ``note_loss``, the hook's way here and the sample itself (timing the
        sample alone would leave out a large part of it).
        """
        if self._due(step):
            self._sample(step, loss, grad_norm)
            self._samples.took(self._monotonic_s() - entered_s + self._loss_read_s,
                               self._step_time_s)
            self._loss_read_s = 0.0
        elif loss is not None and self._check_every_loss:
            self._loss_checks.append((step, loss))
        if self._wake:
            self.run_step_callbacks()
        else:
            self._arm_fast_path()

    def _due(self, step: int) -> bool:
        return (step >= self._next_sample_step or step >= self._next_norm_step
                or step == self._forced_step)

    def _force(self, step: int) -> None:
        """Makes ``step`` a sample, gradient norm included: its loss is a NaN/Inf number."""
        self._forced_step = step
        self.fast_until_step = 0

    def _arm_fast_path(self) -> None:
        """The steps before the next one due for a sample or a norm only count."""
        self.fast_until_step = min(self._next_sample_step, self._next_norm_step)
        if self._wake:  # a wake that came while the line above ran is not overwritten
            self.fast_until_step = 0

    def _sample(self, step: int, loss: Any, grad_norm: Any) -> None:
        now_s = self._monotonic_s()
        step_time_ms = None
        if self._last_sample_s is not None and step > self._last_sample_step:
            steps = step - self._last_sample_step
            step_time_ms = duration_ms(now_s - self._last_sample_s) / steps
            self._step_time_s = smoothed(self._step_time_s, ms_to_s(step_time_ms))
        if step >= self._next_norm_step:  # this step was the norm's turn
            self._next_norm_step = step + self._norms.interval_steps
        if step >= self._next_sample_step:  # and the sample's
            self._next_sample_step = step + self._samples.interval_steps
        self._last_sample_s = now_s
        self._last_sample_step = step
        loss = loss if loss is not None else self._last_loss
        from_trainer = self._grad_norm_from_trainer or grad_norm is not None
        grad_norm = grad_norm if grad_norm is not None else self._last_grad_norm
        if self.norms_per_micro_step:
            grad_norm = None
        self._last_loss = None
        self._last_grad_norm = None
        self._grad_norm_from_trainer = False
        source = None if grad_norm is None else ("trainer" if from_trainer else "probe")
        self._record(("step", self._now_ms(), step, loss, grad_norm, step_time_ms, source))
        if step == self._forced_step or nonfinite_number(loss) or nonfinite_number(grad_norm):
            self._flush_soon()

    def record_micro_step_norm(self, norm: Any) -> None:
        """One micro-step's gradient norm, a sample of its own (from the backward's end)."""
        norm = host_value(norm)
        self._record(("step", self._now_ms(), self.global_step, None, norm, None, MICRO_STEP))
        if nonfinite_number(norm):
            self._flush_soon()

    def restart_step_time(self) -> None:
        """The next sample's step time starts there (no step time spans unwatched steps)."""
        self._last_sample_s = None

    # --- any thread ------------------------------------------------------------------

    def wake(self) -> None:
        """Asks for the step callbacks at the next step boundary; from any thread (an
        arrived command is applied one step later, not at the next sample)."""
        self._wake = True
        self.fast_until_step = 0

    def run_step_callbacks(self) -> None:
        """Runs the step callbacks now (on the training thread) and sets the fast path up
        to the next step due for a sample or a norm."""
        self._wake = False  # first: a wake during the callbacks asks for another run
        self._run_callbacks()
        self._arm_fast_path()

    # --- flusher thread --------------------------------------------------------------

    def check_losses(self) -> None:
        """Reads the losses queued since the last check, all at once; a NaN/Inf one becomes
        a sample of its own (no gradient norm: its gradients are gone by now)."""
        checks = self._loss_checks
        taken: list[tuple[int, Any]] = []
        while checks:
            try:
                taken.append(checks.popleft())
            except IndexError:
                break
        if not taken:
            return
        try:
            flags = nonfinite_flags([loss for _step, loss in taken])
        except Exception:  # not numbers after all: nothing to report
            self._warn_once("loss_check", "dsec: losses could not be read")
            return
        for (step, loss), bad in zip(taken, flags, strict=True):
            if bad:
                self._record(("step", self._now_ms(), step, loss, None, None, None))
