"""Policies as data, and the audit record of every decision the engine takes."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from dsec.schemas.actuations import ActionParams
from dsec.schemas.base import Event, Identifier, Model, Version, WorkerIdentity

Seconds = Annotated[float, Field(ge=0, le=30 * 86400)]
ParamName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
Condition = Annotated[str, Field(min_length=1, max_length=4096)]
# ``<action kind>.<field>``, e.g. ``memory_cap.limit_bytes``
BoundField = Annotated[str, Field(pattern=r"^[a-z_]+\.[a-z_]+$", max_length=64)]
_ACTION = TypeAdapter(ActionParams)

class PolicyAction(Model):
    params: ActionParams
    ttl_s: Annotated[float, Field(gt=0, le=3600)] = 60.0

class TargetSelector(Model):
    """Which targets a policy watches; an empty list or map matches everything.

    ``pools``, ``gpu_models`` and ``labels`` match the feature event's ``tags``
    (``pool``, ``gpu_model`` and the label's own key).
    """

    job_ids: Annotated[list[Identifier], Field(max_length=64)] = Field(default_factory=list)
    pools: Annotated[list[Identifier], Field(max_length=64)] = Field(default_factory=list)
    gpu_models: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)] = (
        Field(default_factory=list)
    )
    labels: Annotated[
        dict[ParamName, Annotated[str, Field(max_length=128)]], Field(max_length=16)
    ] = Field(default_factory=dict)

    def matches(self, job_id: str, tags: dict[str, str]) -> bool:
        if self.job_ids and job_id not in self.job_ids:
            return False
        if self.pools and tags.get("pool") not in self.pools:
            return False
        if self.gpu_models and tags.get("gpu_model") not in self.gpu_models:
            return False
        return all(tags.get(key) == value for key, value in self.labels.items())

class PolicyStage(Model):
    """One step of a staged policy: ``actions`` on the way up, ``undo`` on the way down.

    ``condition``, when given, must hold as well for the policy to climb into this stage.
    ``bind`` / ``undo_bind`` take an action field from a policy parameter
    (``memory_cap.limit_bytes: base_quota_bytes``), so a tuned parameter reaches the
    command; the result is checked against the action's bounds like any other.
    """

    condition: Condition | None = None
    actions: Annotated[list[ActionParams], Field(min_length=1, max_length=8)]
    undo: Annotated[list[ActionParams], Field(max_length=8)] = Field(default_factory=list)
    bind: Annotated[dict[BoundField, ParamName], Field(max_length=8)] = Field(
        default_factory=dict
    )
    undo_bind: Annotated[dict[BoundField, ParamName], Field(max_length=8)] = Field(
        default_factory=dict
    )


class ParamBounds(Model):
    """The floor and ceiling of a tunable parameter: no version, pool override or
    meta-policy may take it outside them, so a feedback loop cannot drive a cap to zero."""

    min_value: Annotated[float, Field(allow_inf_nan=False)]
    max_value: Annotated[float, Field(allow_inf_nan=False)]

    @model_validator(mode="after")
    def _ordered(self) -> ParamBounds:
        if self.min_value > self.max_value:
            raise ValueError("min_value must not exceed max_value")
        return self

    def clamp(self, value: float) -> float:
        return min(max(value, self.min_value), self.max_value)


class PolicyTune(Model):
    """A meta-policy's action: publish a new version of ``policy`` with ``param`` moved by
    ``delta``, clamped to [``min_value``, ``max_value``]."""

    policy: Identifier
    param: ParamName
    delta: Annotated[float, Field(allow_inf_nan=False)]
    min_value: Annotated[float, Field(allow_inf_nan=False)]
    max_value: Annotated[float, Field(allow_inf_nan=False)]

    @model_validator(mode="after")
    def _ordered(self) -> PolicyTune:
        if self.min_value > self.max_value:
            raise ValueError("min_value must not exceed max_value")
        return self

class PolicySpec(Model):
    """A policy: a CEL condition over a target's features, and what to do when it holds.

    Exactly one of ``action`` (one command each time it fires), ``stages`` (applied one
    at a time while the condition holds, undone in reverse once ``exit_condition`` has
    held for ``hold_s``) or ``tune`` (a meta-policy that republishes another policy).
    """

    name: Identifier
    version: Version = 1
    description: Annotated[str, Field(max_length=4096)] = ""
    selector: TargetSelector = Field(default_factory=TargetSelector)
    params: Annotated[
        dict[ParamName, Annotated[float, Field(allow_inf_nan=False)]], Field(max_length=32)
    ] = Field(default_factory=dict)
    # Floors and ceilings of the parameters that may be tuned (by a pool or a meta-policy).
    bounds: Annotated[dict[ParamName, ParamBounds], Field(max_length=32)] = Field(
        default_factory=dict)
    # A canary: this version runs for the workers of this pool alone, in place of the
    # fleet's version while it is the newer (published keyed ``policy_key(name, pool)``).
    pool: Identifier | None = None
    condition: Condition
    # Hysteresis: once active, stages come down only while this holds (default: the
    # condition does not hold), so a signal hovering at the threshold cannot flap.
    exit_condition: Condition | None = None
    for_s: Seconds = 0.0
    # The oldest feature value (seconds since the target reported it) a condition takes;
    # an older one counts as missing, which leaves the policy's state as it was. None:
    # any age (a feature an event does not carry keeps its last known value).
    max_age_s: Annotated[float, Field(gt=0, le=30 * 86400)] | None = None
    cooldown_s: Seconds = 60.0
    # Each gap between two fires for one target is ``cooldown_s`` plus up to this much,
    # drawn from the target's name and its last fire: targets that fired together (a fleet
    # seen at once by a periodic policy) drift apart instead of firing together ever after.
    jitter_s: Seconds = 0.0
    stage_interval_s: Seconds = 30.0
    hold_s: Seconds = 60.0
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    action: PolicyAction | None = None
    stages: Annotated[list[PolicyStage], Field(max_length=8)] = Field(default_factory=list)
    tune: PolicyTune | None = None
    command_ttl_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # ``{worker_id}``, ``{job_id}``, ``{node_id}``, ``{param}`` and ``{tag}`` placeholders.
    alert: Annotated[str, Field(max_length=256)] | None = None
    dry_run: bool = False
    signature: Annotated[str, Field(max_length=256)] | None = None

    @field_validator("params")
    @classmethod
    def _finite(cls, params: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(value) for value in params.values()):
            raise ValueError("parameters must be finite")
        return params

    @model_validator(mode="after")
    def _within_bounds(self) -> PolicySpec:
        for name, bounds in self.bounds.items():
            value = self.params.get(name)
            if value is None:
                raise ValueError(f"bounds.{name}: no parameter {name!r}")
            if bounds.clamp(value) != value:
                raise ValueError(f"params.{name}: {value:g} outside its bounds "
                                 f"[{bounds.min_value:g}, {bounds.max_value:g}]")
        return self

    @model_validator(mode="after")
    def _one_kind_of_action(self) -> PolicySpec:
        given = [self.action is not None, bool(self.stages), self.tune is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of action, stages or tune")
        for index, stage in enumerate(self.stages):
            for what, binding, actions in (("bind", stage.bind, stage.actions),
                                           ("undo_bind", stage.undo_bind, stage.undo)):
                for bound, param in binding.items():
                    if param not in self.params:
                        raise ValueError(f"stages.{index}.{what}: no parameter {param!r}")
                    kind, _, field = bound.partition(".")
                    if not any(action.kind == kind and field in type(action).model_fields
                               for action in actions):
                        raise ValueError(f"stages.{index}.{what}: no action field {bound!r}")
            # a bound value outside the action's bounds fails here, not at firing time
            self.stage_actions(index)
            self.stage_actions(index, undo=True)
        return self

    def effective_stages(self) -> list[PolicyStage]:
        if self.action is not None:
            return [PolicyStage(actions=[self.action.params])]
        return list(self.stages)

    @property
    def ttl_s(self) -> float:
        return self.action.ttl_s if self.action is not None else self.command_ttl_s

    @property
    def one_shot(self) -> bool:
        """Fires, then fires again after the cooldown while the condition still holds."""
        stages = self.effective_stages()
        return self.tune is not None or (len(stages) == 1 and not stages[0].undo)

    def stage_actions(self, index: int, undo: bool = False) -> list[ActionParams]:
        """The actions of stage ``index`` (0-based) with bound parameters filled in."""
        stage = self.effective_stages()[index]
        actions, binding = (stage.undo, stage.undo_bind) if undo else (stage.actions, stage.bind)
        resolved = []
        for action in actions:
            updates = {
                bound.partition(".")[2]: self.params[param]
                for bound, param in binding.items()
                if bound.partition(".")[0] == action.kind
            }
            if updates:
                # Parameters are floats; integral action fields take them when integral.
                updates = {k: int(v) if float(v).is_integer() else v for k, v in updates.items()}
                body = {**action.model_dump(mode="json"), **updates}
                try:
                    action = _ACTION.validate_python(body)
                except ValidationError as exc:
                    problem = exc.errors()[0]["msg"]
                    raise ValueError(f"bound action out of bounds: {problem}") from None
            resolved.append(action)
        return resolved

class PolicyDeletion(Event):
    """A signed request to stop running policy ``deletes`` up to ``up_to_version``: what
    ``dsec policy delete`` writes to the policies topic, keyed by the policy's name. A bare
    tombstone carries no signature and deletes nothing; a version published after the
    deletion runs, and a replayed deletion does not remove it."""

    deletes: Identifier
    up_to_version: Version
    # A canary's rollback: only the version for this pool (keyed ``policy_key``) goes.
    pool: Identifier | None = None
    signature: Annotated[str, Field(max_length=256)] | None = None


def policy_key(name: str, pool: str | None = None) -> str:
    """The policies-topic key of policy ``name``'s fleet version, or of its canary in
    ``pool`` (identifiers never contain ``@``)."""
    return f"{name}@{pool}" if pool else name


class DecisionKind(StrEnum):
    FIRED = "fired"
    STAGED_UP = "staged_up"
    STAGED_DOWN = "staged_down"
    SUPPRESSED_COOLDOWN = "suppressed_cooldown"
    SUPPRESSED_PRIORITY = "suppressed_priority"
    SUPPRESSED_RATE_LIMIT = "suppressed_rate_limit"
    DRY_RUN = "dry_run"
    POLICY_ACCEPTED = "policy_accepted"
    POLICY_DELETED = "policy_deleted"
    POLICY_REJECTED = "policy_rejected"
    POOL_ACCEPTED = "pool_accepted"
    POOL_DELETED = "pool_deleted"
    POOL_REJECTED = "pool_rejected"
    EVALUATION_ERROR = "evaluation_error"
    # An alerting policy that fires once per cooldown (no stages to undo): its condition
    # stopped holding for the target, which resolves the alert it raised.
    RESOLVED = "resolved"

class PolicyDecision(Event):
    policy_name: Identifier
    policy_version: Version
    identity: WorkerIdentity | None = None
    decision: DecisionKind
    stage: Annotated[int, Field(ge=0, le=8)] | None = None
    actuation_id: Annotated[str, Field(max_length=64)] | None = None
    detail: Annotated[str, Field(max_length=2048)] = ""
    # The policy's alert as rendered for the target, and the GPU the target's features
    # came from: what an alert and the GPU-health record name.
    alert: Annotated[str, Field(max_length=256)] | None = None
    gpu_uuid: Identifier | None = None
    gpu_model: Annotated[str, Field(max_length=128)] = ""
