"""A veRL tracking backend: veRL's metrics, as its trainer logs them, become dsec samples.

veRL's ``Tracking`` (``verl/utils/tracking.py``) builds its backends from a fixed list of
names, so a new one cannot be named in ``trainer.logger``. What it does keep is a mapping
``tracking.logger`` of name to backend, and it hands every ``log(data, step)`` to each:
``attach(tracking)`` adds dsec's there. ``dsec run`` does that for every ``Tracking``
veRL builds, so ``dsec run -- python -m verl.trainer.main_ppo ...`` needs no change to
the code or the config.

Per training step veRL logs ``actor/pg_loss``, ``actor/grad_norm``, ``critic/score/mean``
(the task's reward), ``response_length/mean`` and ``timing_s/step``, among many: they
become one step sample (loss, gradient norm, step time) and one episode sample (the mean
score and mean response length of the step's batch). The rest stays veRL's own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dsec.ingest.integrations.logged import LoggedKeys, record_logged

log = logging.getLogger(__name__)

BACKEND_NAME = "dsec"
VERL_KEYS = LoggedKeys(
    loss=("actor/pg_loss", "actor/loss", "critic/vf_loss"),
    grad_norm=("actor/grad_norm", "critic/grad_norm"),
    step_time_s=("timing_s/step",),
    reward=("critic/score/mean", "critic/rewards/mean"),
    length=("response_length/mean",),
)


def _current_probe() -> Any:
    from dsec.ingest.current import current_probe

    return current_probe()


class DsecTracking:
    """A backend with veRL's backend interface: ``log(data, step)`` and ``finish()``."""

    def __init__(self, probe: Any = None) -> None:
        self._probe = probe
        self.steps_logged = 0

    def log(self, data: Mapping[str, Any], step: int) -> None:
        probe = self._probe or _current_probe()
        if probe is None:
            return
        try:
            stepped, _ = record_logged(probe, step, data, VERL_KEYS)
            self.steps_logged += stepped
            if stepped:
                probe.run_step_callbacks()  # a training step ended: a safe point for commands
        except Exception:  # tracking never stops veRL's trainer
            log.exception("dsec: veRL metrics of step %s were not reported", step)

    def finish(self) -> None:
        """Nothing to close: the probe flushes on its own and at exit."""


def attach(tracking: Any, probe: Any = None) -> DsecTracking:
    """Adds the dsec backend to a veRL ``Tracking`` (once)."""
    existing = tracking.logger.get(BACKEND_NAME)
    if isinstance(existing, DsecTracking):
        return existing
    backend = DsecTracking(probe)
    tracking.logger[BACKEND_NAME] = backend
    return backend
