"""A framework's logged metrics as dsec samples: which keys mean what, and one recording.

Frameworks log a flat mapping per step or iteration (``loss``, ``critic/score/mean``, ...).
A ``LoggedKeys`` says, for one framework, which keys carry the loss, the gradient norm, the
step time, the reward and the episode (or completion) length, first match winning; one
logged mapping then becomes one step sample (``Probe.record_logged_step``) and, when it
carries a reward, one episode sample of the logged mean reward and mean length. A mean is
not an episode: the reward-variance features see the spread of the logged means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dsec.schemas.units import duration_ms


class LoggedSink(Protocol):
    def record_logged_step(self, step: int, loss: Any = None, grad_norm: Any = None,
                           step_time_ms: float | None = None) -> None: ...

    def record_episode(self, reward: float, length: int, *, terminated: bool = True,
                       truncated: bool = False, termination_reason: str | None = None,
                       ) -> None: ...


@dataclass(frozen=True)
class LoggedKeys:
    loss: tuple[str, ...] = ()
    grad_norm: tuple[str, ...] = ()
    step_time_s: tuple[str, ...] = ()
    reward: tuple[str, ...] = ()
    length: tuple[str, ...] = ()


def first_number(metrics: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    """The first of ``keys`` whose value is a number (a NaN/Inf one too), or None."""
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, bool):
            continue
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None


def record_logged(sink: LoggedSink, step: int, metrics: Mapping[str, Any],
                  keys: LoggedKeys) -> tuple[bool, bool]:
    """Records what ``metrics`` carries; returns (a step recorded, an episode recorded)."""
    loss = first_number(metrics, keys.loss)
    grad_norm = first_number(metrics, keys.grad_norm)
    step_time_s = first_number(metrics, keys.step_time_s)
    stepped = loss is not None or grad_norm is not None
    if stepped:
        sink.record_logged_step(step, loss, grad_norm,
                                None if step_time_s is None else duration_ms(step_time_s))
    reward = first_number(metrics, keys.reward)
    if reward is None or not math.isfinite(reward):
        return stepped, False
    length = first_number(metrics, keys.length)
    sink.record_episode(reward, 0 if length is None or not math.isfinite(length)
                        else max(0, round(length)))
    return stepped, True
