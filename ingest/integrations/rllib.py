"""A Ray RLlib callback: ``config.callbacks(DsecRLlibCallback)``.

- ``on_episode_end``: every episode an env runner finishes, in a process with a probe (the
  local env runner with ``num_env_runners=0``): return, length, terminated or truncated.
  Under ``dsec run`` every env runner starts its own probe and its ``gym.make``
  environments report their episodes themselves, so the callback leaves them be;
- ``on_train_result``: one step sample per training iteration from the first learner
  module's results (``total_loss``, the gradient's global norm when RLlib clips, the
  iteration's time), and the iteration is a step boundary: the commands that arrived are
  applied there.

RLlib builds the callback itself (no arguments), in each process that runs one: it finds
the probe of its process, and does nothing where there is none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dsec.ingest.integrations.logged import LoggedKeys, record_logged

try:
    from ray.rllib.callbacks.callbacks import RLlibCallback
except ImportError as exc:  # pragma: no cover - exercised without ray[rllib]
    raise ImportError("dsec's RLlib callback needs ray[rllib]: pip install 'ray[rllib]'"
                      ) from exc

log = logging.getLogger(__name__)

ALL_MODULES = "__all_modules__"


def _current_probe() -> Any:
    from dsec.ingest.current import current_probe

    return current_probe()


def iteration_keys(result: Mapping[str, Any]) -> LoggedKeys:
    """The keys of the first learner module's loss and norm in a flattened result."""
    modules = [name for name in result.get("learners", {}) if name != ALL_MODULES]
    if not modules:
        return LoggedKeys(step_time_s=("time_this_iter_s",))
    module = f"learners/{modules[0]}"
    return LoggedKeys(loss=(f"{module}/total_loss",),
                      grad_norm=(f"{module}/gradients_default_optimizer_global_norm",),
                      step_time_s=("time_this_iter_s",))


def flattened(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, Mapping):
            out.update(flattened(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def reported_by_its_environments(env: Any) -> bool:
    """Whether the runner's sub-environments report their own episodes (``dsec.wrap_env``,
    or ``gym.make`` under ``dsec run``): the callback then leaves episodes to them."""
    from dsec.ingest.gym_wrapper import EpisodeReporter

    vector = getattr(env, "unwrapped", env)
    return any(isinstance(sub, EpisodeReporter) for sub in getattr(vector, "envs", ()) or ())


class DsecRLlibCallback(RLlibCallback):
    def on_episode_end(self, *, episode: Any, env: Any = None, **kwargs: Any) -> None:
        probe = _current_probe()
        if probe is None or reported_by_its_environments(env):
            return
        try:
            probe.record_episode(float(episode.get_return()), len(episode),
                                 terminated=bool(episode.is_terminated),
                                 truncated=bool(episode.is_truncated))
        except Exception:  # telemetry never stops the env runner
            log.exception("dsec: an RLlib episode was not reported")

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        probe = _current_probe()
        if probe is None:
            return
        try:
            step = int(result.get("training_iteration", 0))
            record_logged(probe, step, flattened(result), iteration_keys(result))
            probe.run_step_callbacks()
        except Exception:
            log.exception("dsec: an RLlib training result was not reported")
