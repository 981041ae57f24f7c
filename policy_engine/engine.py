"""One evaluation step: a batch of feature events in; commands, audit records and tuned
policy versions out. Pure apart from the two state mappings it is given (Faust tables in
the stream job, dicts offline and in tests).

Conditions are evaluated for the whole batch at once (numpy); the per-target state machine
then runs only for rows whose condition holds or whose policy is not idle.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from pydantic import TypeAdapter

from dsec.policy_engine.decide import PolicyState, cooldown_s, decide
from dsec.policy_engine.rate_limit import CommandBudget
from dsec.policy_engine.registry import CompiledPolicy, PolicyRegistry
from dsec.schemas import ActionKind, ActuationCommand, FeatureEvent, PolicyDecision, Signer
from dsec.schemas.actuations import ActionParams
from dsec.schemas.policies import DecisionKind, PolicySpec

log = logging.getLogger(__name__)
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
# Triggers, not settings: two policies asking for one conflict with nothing.
_UNOWNED_KINDS = {ActionKind.SNAPSHOT}
_OWNED_KINDS = tuple(kind for kind in ActionKind if kind not in _UNOWNED_KINDS)
_IDLE = PolicyState()
_ACTION = TypeAdapter(ActionParams)


@dataclass
class EngineOutput:
    commands: list[ActuationCommand] = field(default_factory=list)
    decisions: list[PolicyDecision] = field(default_factory=list)
    policies: list[PolicySpec] = field(default_factory=list)


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
        signer: Signer,
    ) -> None:
        self.registry = registry
        self.states = states
        self.knobs = knobs
        self._signer = signer
        self._reported: set[tuple[str, int]] = set()
        self.limits = registry.limits
        self._budget = CommandBudget(self.limits.commands_per_worker_per_min)

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
        self._budget.forget_before(max(e.event_time_ms for e in events))
        for policy in policies:
            try:
                self._evaluate_policy(policy, events, targets, columns, out)
            except Exception as exc:  # one broken policy must not stop the others
                log.exception("policy %s v%s failed", policy.spec.name, policy.spec.version)
                self._report(policy, f"{type(exc).__name__}: {exc}", out)
                continue
            errors = [c.last_error for c in (policy.enter, policy.exit, *policy.stage_conditions)
                      if c is not None and c.last_error]
            if errors:
                self._report(policy, errors[0], out)
        self._resume_orphaned_claims(events, out)
        return out

    def _report(self, policy: CompiledPolicy, problem: str, out: EngineOutput) -> None:
        """An evaluation error, audited once per policy version."""
        spec = policy.spec
        if (spec.name, spec.version) in self._reported:
            return
        self._reported.add((spec.name, spec.version))
        out.decisions.append(PolicyDecision(
            policy_name=spec.name, policy_version=spec.version,
            decision=DecisionKind.EVALUATION_ERROR, detail=problem[:2048],
        ))

    def _evaluate_policy(
        self, policy: CompiledPolicy, events: Sequence[FeatureEvent], targets: list[str],
        columns: dict[str, np.ndarray], out: EngineOutput,
    ) -> None:
        spec, rows = policy.spec, len(events)
        # A feature event carries the features its input batch updated. One that carries
        # none of this policy's features says nothing about it: its state (a ``for:``
        # timer, a stage, a hold) stays as it was instead of being reset by a row whose
        # condition is an error for want of data.
        informed = np.zeros(rows, dtype=bool)
        for name in policy.feature_names:
            informed |= ~np.isnan(columns[name])
        scoped = {**columns, **{k: np.full(rows, v) for k, v in spec.params.items()}}
        enter = policy.enter.holds(scoped, rows)
        exit_ = policy.exit.holds(scoped, rows) if policy.exit is not None else ~enter
        climb = [c.holds(scoped, rows) if c is not None else None
                 for c in policy.stage_conditions]
        selector = spec.selector
        top = len(policy.stage_conditions)
        everyone = selector == type(selector)()
        prefix = f"{spec.name}|"
        states = self.states
        for row, event in enumerate(events):
            if not informed[row]:
                continue
            key = prefix + targets[row]
            if not enter[row] and key not in states:
                continue
            if not everyone and not selector.matches(event.identity.job_id, event.tags):
                continue
            old = PolicyState.from_json(states.get(key))
            if old.stage > top:  # a new version with fewer stages
                old = replace(old, stage=top)
            next_stage = 0 if spec.one_shot else min(old.stage, len(climb) - 1)
            condition = climb[next_stage] if climb else None
            climb_holds = condition[row] if condition is not None else True
            new, kind = decide(spec, old, bool(enter[row]), event.event_time_ms,
                               exit_holds=bool(exit_[row]), climb_holds=bool(climb_holds),
                               cooldown_floor_s=self.limits.cooldown_floor_s)
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
            cooldown_ms = int(cooldown_s(spec, self.limits.cooldown_floor_s) * 1000)
            audit(kind, new.stage, f"cooling down until "
                  f"{(old.last_fired_ms or 0) + cooldown_ms}; {detail}")
            return
        if spec.tune is not None:
            self._tune(spec, kind, audit, detail, out)
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
        if not actions and not undo:
            audit(kind, new.stage, f"stage {stage}: nothing to {said}; {detail}")
        grants: list[tuple[PolicySpec, ActionParams, str] | str] = []
        if undo:
            undo_by_kind = {a.kind: a for a in actions}
            released = [a.kind for a in spec.stage_actions(stage - 1)]
            kinds = list(dict.fromkeys([*released, *undo_by_kind]))
            grants = [self._release(spec, event, k, undo_by_kind.get(k)) for k in kinds]
        else:
            grants = [self._apply(spec, event, action) for action in actions]
        for index, grant in enumerate(grants):
            if grant is None:
                continue
            if isinstance(grant, str):
                audit(DecisionKind.SUPPRESSED_PRIORITY, new.stage, f"{grant}; {detail}")
                continue
            owner, action, how = grant
            if not self._within_budget(event):
                audit(DecisionKind.SUPPRESSED_RATE_LIMIT, new.stage,
                      f"{said} stage {stage}: {action.kind} not sent, {self._over_budget}; "
                      f"{detail}")
                continue
            command = self._signer.sign(ActuationCommand(
                actuation_id=actuation_id(owner.name, owner.version, event.identity.job_id,
                                          event.identity.worker_id, spec.name, stage, said,
                                          event.event_time_ms, index),
                event_time_ms=event.event_time_ms,
                target=event.identity,
                expires_at_ms=event.event_time_ms + int(owner.ttl_s * 1000),
                policy_name=owner.name,
                policy_version=owner.version,
                action=action,
                reason=f"{spec.name} v{spec.version} {said} stage {stage}{how}: "
                       f"{spec.condition}"[:1024],
            ))
            out.commands.append(command)
            audit(kind, new.stage, f"{said} stage {stage}: {action.kind}{how}; {detail}",
                  command.actuation_id)

    def _within_budget(self, event: FeatureEvent) -> bool:
        worker = f"{event.identity.job_id}|{event.identity.worker_id}"
        return self._budget.admit(worker, event.event_time_ms)

    @property
    def _over_budget(self) -> str:
        return (f"the worker had {self._budget.per_min} commands in the last 60 s "
                "(commands_per_worker_per_min)")

    # Knob arbitration. Per (target, knob) the table keeps every policy's claim and which
    # one is in effect: the highest priority (a tie keeps the one in effect). A claim
    # outranked now is kept, and takes effect when the claims above it are released.
    # One-shot policies have no undo: their claim lasts as long as their command is valid.

    def _knob(self, event: FeatureEvent, kind: str) -> tuple[str, dict]:
        key = knob_key(event, kind)
        entry = self.knobs.get(key) or {"claims": {}, "applied": None}
        now = event.event_time_ms
        entry["claims"] = {
            name: claim for name, claim in entry["claims"].items()
            if self.registry.get(name) is not None
            and now < (claim.get("until_ms") or float("inf"))
        }
        if entry["applied"] not in entry["claims"]:
            entry["applied"] = None
        return key, entry

    @staticmethod
    def _top(entry: dict) -> str | None:
        claims = entry["claims"]
        if not claims:
            return None
        return max(claims, key=lambda n: (claims[n]["priority"], n == entry["applied"]))

    def _store(self, key: str, entry: dict) -> None:
        if entry["claims"]:
            self.knobs[key] = entry
        else:
            self.knobs.pop(key, None)

    def _apply(self, spec: PolicySpec, event: FeatureEvent,
               action: ActionParams) -> tuple[PolicySpec, ActionParams, str] | str:
        if action.kind in _UNOWNED_KINDS:
            return spec, action, ""
        key, entry = self._knob(event, action.kind)
        until_ms = event.event_time_ms + int(spec.ttl_s * 1000) if spec.one_shot else None
        entry["claims"][spec.name] = {"priority": spec.priority, "until_ms": until_ms,
                                      "action": action.model_dump(mode="json")}
        top = self._top(entry)
        if top == spec.name:
            entry["applied"] = spec.name
        self._store(key, entry)
        if top == spec.name:
            return spec, action, ""
        holder = entry["claims"][top]
        return (f"apply {action.kind}: deferred, held by {top} (priority "
                f"{holder['priority']})")

    def _release(self, spec: PolicySpec, event: FeatureEvent, kind: str,
                 undo: ActionParams | None) -> tuple[PolicySpec, ActionParams, str] | str | None:
        if kind in _UNOWNED_KINDS:
            return (spec, undo, "") if undo is not None else None
        key, entry = self._knob(event, kind)
        in_effect = entry["applied"] == spec.name
        entry["claims"].pop(spec.name, None)
        if not in_effect:
            self._store(key, entry)
            return f"undo {kind}: was not in effect, held by {entry['applied'] or 'nobody'}"
        top = self._top(entry)
        entry["applied"] = top
        self._store(key, entry)
        if top is None:
            return (spec, undo, "") if undo is not None else None
        owner = self.registry.get(top)
        resumed = _ACTION.validate_python(entry["claims"][top]["action"])
        return owner, resumed, f" (resumes {top})"

    def _resume_orphaned_claims(self, events: Sequence[FeatureEvent], out: EngineOutput) -> None:
        """A claim deferred behind one that has since expired, or whose policy was deleted,
        takes effect at its target's next feature event: the holder never undoes, so
        nothing else would hand the knob on."""
        if not self.knobs:
            return
        seen: set[str] = set()
        for event in events:
            target = f"{event.identity.job_id}|{event.identity.worker_id}"
            if target in seen:
                continue
            seen.add(target)
            for kind in _OWNED_KINDS:
                if knob_key(event, kind) not in self.knobs:
                    continue
                key, entry = self._knob(event, kind)
                top = self._top(entry) if entry["applied"] is None else None
                entry["applied"] = top or entry["applied"]
                self._store(key, entry)
                owner = self.registry.get(top) if top is not None else None
                if owner is None:
                    continue
                action = _ACTION.validate_python(entry["claims"][top]["action"])
                if not self._within_budget(event):
                    out.decisions.append(PolicyDecision(
                        event_time_ms=event.event_time_ms, policy_name=owner.name,
                        policy_version=owner.version, identity=event.identity,
                        decision=DecisionKind.SUPPRESSED_RATE_LIMIT,
                        detail=f"resume {kind} not sent, {self._over_budget}",
                    ))
                    continue
                command = self._signer.sign(ActuationCommand(
                    actuation_id=actuation_id(owner.name, owner.version, event.identity.job_id,
                                              event.identity.worker_id, "resume", kind,
                                              event.event_time_ms),
                    event_time_ms=event.event_time_ms,
                    target=event.identity,
                    expires_at_ms=event.event_time_ms + int(owner.ttl_s * 1000),
                    policy_name=owner.name,
                    policy_version=owner.version,
                    action=action,
                    reason=f"{owner.name} v{owner.version} resumes {kind}: the claim above "
                           "it expired or its policy was removed",
                ))
                out.commands.append(command)
                out.decisions.append(PolicyDecision(
                    event_time_ms=event.event_time_ms, policy_name=owner.name,
                    policy_version=owner.version, identity=event.identity,
                    decision=DecisionKind.FIRED, actuation_id=command.actuation_id,
                    detail=f"resumes {kind}: the claim above it lapsed",
                ))

    def _tune(
        self, spec: PolicySpec, kind: DecisionKind, audit: Callable[..., None], detail: str,
        out: EngineOutput,
    ) -> None:
        tune = spec.tune
        assert tune is not None
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
        out.policies.append(self._signer.sign(successor))
        audit(kind, 0, f"published {change}; {detail}")
