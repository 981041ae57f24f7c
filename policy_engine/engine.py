"""One evaluation step: a batch of feature events in; commands, audit records and tuned
policy versions out. Pure apart from the two state mappings it is given (Faust tables in
the stream job, dicts offline and in tests).

Conditions are evaluated for the whole batch at once (numpy); the per-target state machine
then runs only for rows whose condition holds or whose policy is not idle.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dsec.policy_engine.decide import PolicyState, decide
from dsec.policy_engine.registry import CompiledPolicy, PolicyRegistry
from dsec.schemas import ActionKind, ActuationCommand, FeatureEvent, PolicyDecision, sign
from dsec.schemas.policies import DecisionKind, PolicySpec

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
# Triggers, not settings: two policies asking for one conflict with nothing.
_UNOWNED_KINDS = {ActionKind.SNAPSHOT}
_IDLE = PolicyState()


@dataclass
class EngineOutput:
    commands: list[ActuationCommand] = field(default_factory=list)
    decisions: list[PolicyDecision] = field(default_factory=list)
    policies: list[PolicySpec] = field(default_factory=list)


def state_key(policy_name: str, event: FeatureEvent) -> str:
    return f"{policy_name}|{event.identity.job_id}|{event.identity.worker_id}"


def knob_key(event: FeatureEvent, kind: str) -> str:
    return f"{event.identity.job_id}|{event.identity.worker_id}|{kind}"


def actuation_id(*parts: object) -> str:
    """Derived from what caused the command, so a replayed event yields the same id and
    the actuator, idempotent by id, applies it once."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def render_alert(template: str, spec: PolicySpec, event: FeatureEvent) -> str:
    """Substitutes ``{name}`` from identity, tags and parameters; nothing else is run."""
    values = {
        **{k: _number(v) for k, v in spec.params.items()},
        **event.tags,
        "job_id": event.identity.job_id,
        "worker_id": event.identity.worker_id,
        "node_id": event.identity.node_id,
        "gpu_uuid": event.gpu_uuid or "unknown",
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), "unknown"), template)


def tuned(spec: PolicySpec, meta: PolicySpec) -> PolicySpec | None:
    """The next version of ``spec`` with the meta-policy's parameter moved, or ``None``
    when it is already at its bound."""
    tune = meta.tune
    assert tune is not None
    current = spec.params.get(tune.param)
    if current is None:
        return None
    value = min(max(current + tune.delta, tune.min_value), tune.max_value)
    if value == current:
        return None
    body = spec.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    body["version"] = spec.version + 1
    body["params"] = {**spec.params, tune.param: value}
    return PolicySpec.model_validate(body)


class Engine:
    def __init__(
        self,
        registry: PolicyRegistry,
        states: MutableMapping[str, dict],
        knobs: MutableMapping[str, dict],
        signing_key: bytes,
    ) -> None:
        self.registry = registry
        self.states = states
        self.knobs = knobs
        self._signing_key = signing_key

    def evaluate(self, events: Sequence[FeatureEvent]) -> EngineOutput:
        out = EngineOutput()
        rows = len(events)
        if not rows:
            return out
        policies = self.registry.active()
        names = frozenset().union(*(p.feature_names for p in policies))
        columns = {
            name: np.fromiter((e.features.get(name, np.nan) for e in events), float, rows)
            for name in names
        }
        targets = [f"{e.identity.job_id}|{e.identity.worker_id}" for e in events]
        for policy in policies:
            self._evaluate_policy(policy, events, targets, columns, out)
        return out

    def _evaluate_policy(
        self, policy: CompiledPolicy, events: Sequence[FeatureEvent], targets: list[str],
        columns: dict[str, np.ndarray], out: EngineOutput,
    ) -> None:
        spec, rows = policy.spec, len(events)
        scoped = {**columns, **{k: np.full(rows, v) for k, v in spec.params.items()}}
        enter = policy.enter.holds(scoped, rows)
        exit_ = policy.exit.holds(scoped, rows) if policy.exit is not None else ~enter
        climb = [c.holds(scoped, rows) if c is not None else None
                 for c in policy.stage_conditions]
        selector = spec.selector
        everyone = selector == type(selector)()
        prefix = f"{spec.name}|"
        states = self.states
        for row, event in enumerate(events):
            key = prefix + targets[row]
            if not enter[row] and key not in states:
                continue
            if not everyone and not selector.matches(event.identity.job_id, event.tags):
                continue
            old = PolicyState.from_json(states.get(key))
            next_stage = 0 if spec.one_shot else min(old.stage, len(climb) - 1)
            condition = climb[next_stage] if climb else None
            climb_holds = condition[row] if condition is not None else True
            new, kind = decide(spec, old, bool(enter[row]), event.event_time_ms,
                               exit_holds=bool(exit_[row]), climb_holds=bool(climb_holds))
            if new != old:
                if new == _IDLE:
                    states.pop(key, None)
                else:
                    states[key] = new.to_json()
            if kind is not None:
                self._act(policy, event, old, new, kind, out)

    def _act(
        self, policy: CompiledPolicy, event: FeatureEvent, old: PolicyState,
        new: PolicyState, kind: DecisionKind, out: EngineOutput,
    ) -> None:
        spec = policy.spec
        detail = ", ".join(
            f"{name}={event.features[name]:g}"
            for name in sorted(policy.feature_names) if name in event.features
        )
        if spec.alert:
            detail = f"alert {render_alert(spec.alert, spec, event)}; {detail}"

        def audit(decision: DecisionKind, stage: int, text: str, actuation: str | None = None):
            out.decisions.append(PolicyDecision(
                event_time_ms=event.event_time_ms, policy_name=spec.name,
                policy_version=spec.version, identity=event.identity, decision=decision,
                stage=stage, actuation_id=actuation, detail=text[:2048],
            ))

        if kind is DecisionKind.SUPPRESSED_COOLDOWN:
            audit(kind, new.stage, f"cooling down until "
                  f"{(old.last_fired_ms or 0) + int(spec.cooldown_s * 1000)}; {detail}")
            return
        if spec.tune is not None:
            self._tune(spec, event, kind, audit, detail, out)
            return
        if spec.one_shot:
            stage, undo = 1, False
        elif new.stage > old.stage:
            stage, undo = new.stage, False
        else:
            stage, undo = old.stage, True
        actions = spec.stage_actions(stage - 1, undo=undo)
        said = "undo" if undo else "apply"
        if kind is DecisionKind.DRY_RUN:
            wanted = "; ".join(a.model_dump_json() for a in actions) or "nothing"
            audit(kind, new.stage, f"would {said} stage {stage}: {wanted}; {detail}")
            return
        if not actions:
            audit(kind, new.stage, f"stage {stage}: nothing to {said}; {detail}")
        for index, action in enumerate(actions):
            claim = self._claim(spec, event, action.kind, release=undo)
            if claim is not None:
                audit(DecisionKind.SUPPRESSED_PRIORITY, new.stage,
                      f"{said} {action.kind}: {claim}; {detail}")
                continue
            command = sign(ActuationCommand(
                actuation_id=actuation_id(spec.name, spec.version, event.identity.job_id,
                                          event.identity.worker_id, stage, said,
                                          event.event_time_ms, index),
                event_time_ms=event.event_time_ms,
                target=event.identity,
                expires_at_ms=event.event_time_ms + int(spec.ttl_s * 1000),
                policy_name=spec.name,
                policy_version=spec.version,
                action=action,
                reason=f"{spec.name} v{spec.version} {said} stage {stage}: {spec.condition}"[
                    :1024],
            ), self._signing_key)
            out.commands.append(command)
            audit(kind, new.stage, f"{said} stage {stage}: {action.kind}; {detail}",
                  command.actuation_id)

    def _claim(self, spec: PolicySpec, event: FeatureEvent, kind: str,
               release: bool) -> str | None:
        """Takes (or gives back) the knob; why not, when a higher priority holds it."""
        if kind in _UNOWNED_KINDS:
            return None
        key = knob_key(event, kind)
        owner = self.knobs.get(key)
        if release:
            if owner is None or owner["policy"] != spec.name:
                return f"held by {owner['policy'] if owner else 'nobody'}, not undone"
            self.knobs.pop(key, None)
            return None
        if owner is not None and owner["policy"] != spec.name and (
                owner["priority"] >= spec.priority):
            return f"held by {owner['policy']} (priority {owner['priority']})"
        self.knobs[key] = {"policy": spec.name, "priority": spec.priority}
        return None

    def _tune(self, spec, event, kind, audit, detail, out) -> None:
        tune = spec.tune
        target = self.registry.get(tune.policy)
        if target is None:
            audit(DecisionKind.EVALUATION_ERROR, 0, f"no policy {tune.policy!r} to tune")
            return
        successor = tuned(target, spec)
        if successor is None:
            audit(kind, 0, f"{tune.policy}.{tune.param} already at its bound; {detail}")
            return
        change = (f"{tune.policy} v{successor.version}: {tune.param} "
                  f"{_number(target.params[tune.param])} -> "
                  f"{_number(successor.params[tune.param])}")
        if kind is DecisionKind.DRY_RUN:
            audit(kind, 0, f"would publish {change}; {detail}")
            return
        out.policies.append(sign(successor, self._signing_key))
        audit(kind, 0, f"published {change}; {detail}")
