"""A gymnasium wrapper that reports every finished episode: length, return, how it ended."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, SupportsFloat

import gymnasium as gym

log = logging.getLogger(__name__)


class EpisodeSink(Protocol):
    def record_episode(
        self,
        reward: float,
        length: int,
        *,
        terminated: bool = True,
        truncated: bool = False,
        termination_reason: str | None = None,
    ) -> None: ...


ReasonFn = Callable[[Any, dict[str, Any]], str | None]  # (last observation, info) -> reason


def _current_probe() -> EpisodeSink | None:
    from dsec.ingest.current import current_probe

    return current_probe()


class EpisodeReporter(gym.Wrapper):
    """Reports each episode to ``sink`` (default: the probe of ``dsec.init``) when it ends.

    The termination reason is ``info[reason_key]`` on the last step, or what ``reason_fn``
    makes of the last observation and info; None when neither says.
    """

    def __init__(
        self,
        env: gym.Env,
        sink: EpisodeSink | None = None,
        reason_key: str = "termination_reason",
        reason_fn: ReasonFn | None = None,
    ) -> None:
        super().__init__(env)
        self._sink = sink
        self._reason_key = reason_key
        self._reason_fn = reason_fn
        self._return = 0.0
        self._length = 0
        self._warned_no_sink = False
        self.episodes_reported = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._return = 0.0
        self._length = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            self._report(observation, bool(terminated), bool(truncated), info)
        return observation, reward, terminated, truncated, info

    def _reason(self, observation: Any, info: dict[str, Any]) -> str | None:
        reason = info.get(self._reason_key)
        if reason is None and self._reason_fn is not None:
            reason = self._reason_fn(observation, info)
        return None if reason is None else str(reason)

    def _report(
        self, observation: Any, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        try:
            sink = self._sink or _current_probe()
            if sink is None:
                if not self._warned_no_sink:
                    self._warned_no_sink = True
                    log.warning("dsec: episode not reported, dsec.init() was not called")
                return
            sink.record_episode(
                self._return, self._length, terminated=terminated, truncated=truncated,
                termination_reason=self._reason(observation, info),
            )
            self.episodes_reported += 1
        except Exception:  # telemetry never breaks the environment loop
            log.exception("dsec: episode report failed")
