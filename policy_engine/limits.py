"""The installation's bounds on policies (``DsecSettings``): condition depth and cost,
the cooldown floor and the per-worker command cap."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsec.policy_engine.condition_check import ConditionLimits
from dsec.schemas.settings import DsecSettings

_DEFAULTS = DsecSettings.model_fields


@dataclass(frozen=True)
class PolicyLimits:
    condition: ConditionLimits = field(default_factory=lambda: ConditionLimits(
        max_depth=_DEFAULTS["policy_condition_max_depth"].default,
        max_cost=_DEFAULTS["policy_condition_max_cost"].default,
    ))
    cooldown_floor_s: float = _DEFAULTS["policy_cooldown_floor_s"].default
    commands_per_worker_per_min: int = _DEFAULTS["commands_per_worker_per_min"].default

    @classmethod
    def from_settings(cls, settings: DsecSettings) -> PolicyLimits:
        return cls(
            condition=ConditionLimits(max_depth=settings.policy_condition_max_depth,
                                      max_cost=settings.policy_condition_max_cost),
            cooldown_floor_s=settings.policy_cooldown_floor_s,
            commands_per_worker_per_min=settings.commands_per_worker_per_min,
        )
