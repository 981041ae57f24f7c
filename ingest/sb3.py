"""A Stable-Baselines3 callback: episodes from SB3's ``Monitor`` infos, steps from the optimizer.

Import this module only when SB3 is wanted: it needs ``pip install 'dsec[sb3]'``.
"""

from __future__ import annotations

from typing import Any

try:
    from stable_baselines3.common.callbacks import BaseCallback
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "dsec's Stable-Baselines3 callback needs stable-baselines3: pip install 'dsec[sb3]'"
    ) from exc


def _current_probe() -> Any:
    from dsec.ingest.current import current_probe

    probe = current_probe()
    if probe is None:
        raise RuntimeError("call dsec.init() first")
    return probe


class DsecCallback(BaseCallback):
    """Reports SB3 training to dsec: pass it to ``model.learn(callback=...)``.

    Episodes come from the ``episode`` entry SB3's ``Monitor`` puts in ``info`` (every SB3
    env made by ``make_vec_env`` has one); optimizer steps, gradient norms and NaN flags
    from the policy's optimizer, which the callback watches for the run.
    """

    def __init__(
        self,
        probe: Any = None,
        reason_key: str = "termination_reason",
        watch_optimizer: bool = True,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        self._probe = probe
        self._reason_key = reason_key
        self._watch_optimizer = watch_optimizer
        self._watched_here = False

    @property
    def probe(self) -> Any:
        if self._probe is None:
            self._probe = _current_probe()
        return self._probe

    def _on_training_start(self) -> None:
        optimizer = getattr(self.model.policy, "optimizer", None)
        if optimizer is None:  # SAC, TD3: the actor's optimizer is the one that tells most
            optimizer = getattr(getattr(self.model.policy, "actor", None), "optimizer", None)
        if self._watch_optimizer and optimizer is not None and not self.probe.watching:
            self.probe.watch(optimizer)
            self._watched_here = True

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", ()):
            episode = info.get("episode")
            if episode is None:
                continue
            truncated = bool(info.get("TimeLimit.truncated", False))
            reason = info.get(self._reason_key)
            self.probe.record_episode(
                float(episode["r"]), int(episode["l"]), terminated=not truncated,
                truncated=truncated, termination_reason=None if reason is None else str(reason),
            )
        return True

    def _on_training_end(self) -> None:
        if self._watched_here:
            self.probe.unwatch()
            self._watched_here = False
