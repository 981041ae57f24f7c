"""One evaluation step: a batch of feature events in; commands, audit records and tuned
policy and pool versions out. Pure apart from the two state mappings it is given, per
(policy, target) ``PolicyState``s and per (target, knob) ``KnobEntry``s (Faust tables in
the stream job, dicts offline and in tests).

Conditions are evaluated for the whole batch at once (numpy), or once per pool where the
batch's targets run in several: each pool's workers run the policy version for their pool
(a canary, else the fleet's) with the pool's parameter overrides. The per-target state
machine then runs only for rows whose condition holds or whose policy is not idle.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dsec.policy_engine.decide import PolicyState, cooldown_s, decide
from dsec.policy_engine.feature_memory import FeatureMemory, FeatureView, KnownFeatures
from dsec.policy_engine.knobs import OWNED_KINDS, KnobBoard, KnobEntry, knob_key
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.rate_limit import CommandBudget
from dsec.policy_engine.registry import CompiledPolicy, PolicyRegistry
from dsec.policy_engine.tuning import Tuner, tuned
from dsec.schemas import ActuationCommand, FeatureEvent, PolicyDecision, Signer
from dsec.schemas.actuations import ActionParams
from dsec.schemas.policies import DecisionKind, PolicySpec
from dsec.schemas.pools import PoolSpec
from dsec.schemas.units import s_to_ms

__all__ = ["Engine", "EngineOutput", "actuation_id", "knob_key", "render_alert", "tuned"]

log = logging.getLogger(__name__)
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_IDLE = PolicyState()


@dataclass
class EngineOutput:
    commands: list[ActuationCommand] = field(default_factory=list)
    decisions: list[PolicyDecision] = field(default_factory=list)
    policies: list[PolicySpec] = field(default_factory=list)
    pools: list[PoolSpec] = field(default_factory=list)


@dataclass(frozen=True)
class _Unit:
    """One policy version over the rows of one pool: ``spec`` is the version with the
    pool's overrides; ``prefix`` keys its per-target states (a dry-run canary beside the
    pool's running version keeps its own)."""

    policy: CompiledPolicy
    spec: PolicySpec
    rows: np.ndarray | None  # None: every row of the batch
    prefix: str
    note: str


def actuation_id(*parts: object) -> str:
    """Derived from what caused the command, so a replayed event yields the same id and
    the actuator, idempotent by id, applies it once."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def render_alert(template: str, spec: PolicySpec, event: FeatureEvent,
                 features: dict[str, float] | None = None) -> str:
    """Substitutes ``{name}`` from identity, tags, the features the condition saw
    (``features``, else the event's) and parameters; nothing else is run."""
    seen = event.features if features is None else features
    values = {
        **{k: _number(v) for k, v in spec.params.items()},
        **{k: _number(v) for k, v in seen.items()},
        **event.tags,
        "job_id": event.identity.job_id,
        "worker_id": event.identity.worker_id,
        "node_id": event.identity.node_id,
        "gpu_uuid": event.gpu_uuid or "unknown",
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), "unknown"), template)


def _values(seen: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The values of ``seen`` (value and age in seconds, by name), without their ages."""
    return {name: value for name, (value, _age_s) in seen.items()}


def _decision(spec: PolicySpec, event: FeatureEvent, kind: DecisionKind, stage: int,
              detail: str, actuation: str | None = None,
              features: dict[str, float] | None = None) -> PolicyDecision:
    """The audit record of a decision on ``event``'s target, naming its alert (rendered
    with ``features``, the values the condition saw) and GPU."""
    return PolicyDecision(
        event_time_ms=event.event_time_ms, policy_name=spec.name,
        policy_version=spec.version, identity=event.identity, decision=kind,
        stage=stage, actuation_id=actuation, detail=detail[:2048],
        alert=render_alert(spec.alert, spec, event, features)[:256] if spec.alert else None,
        gpu_uuid=event.gpu_uuid, gpu_model=event.tags.get("gpu_model", ""),
    )


class Engine:
    def __init__(
        self,
        registry: PolicyRegistry,
        states: MutableMapping[str, PolicyState],
        knobs: MutableMapping[str, KnobEntry],
        signer: Signer,
        pools: PoolRegistry | None = None,
        known: MutableMapping[str, KnownFeatures] | None = None,
    ) -> None:
        """``known``: each target's last known features (see ``FeatureMemory``)."""
        self.registry = registry
        self.pools = pools if pools is not None else PoolRegistry(registry.verifier)
        self.states = states
        self.knobs = knobs
        self.memory = FeatureMemory({} if known is None else known)
        self._knobs = KnobBoard(knobs, registry)
        self._signer = signer
        self._tuner = Tuner(registry, self.pools, signer)
        self._reported: set[tuple[str, ...]] = set()
        self.limits = registry.limits
        self._budget = CommandBudget(self.limits.commands_per_worker_per_min)

    def evaluate(self, events: Sequence[FeatureEvent]) -> EngineOutput:
        out = EngineOutput()
        rows = len(events)
        if not rows:
            return out
        units = self._units(events, out)
        names = frozenset().union(*(u.policy.feature_names for u in units))
        targets = [f"{e.identity.job_id}|{e.identity.worker_id}" for e in events]
        view = self.memory.view(events, targets, names)
        self._budget.forget_idle(max(e.event_time_ms for e in events))
        for unit in units:
            policy = unit.policy
            try:
                self._evaluate_policy(unit, events, targets, view, out)
            except Exception as exc:  # one broken policy must not stop the others
                log.exception("policy %s v%s failed", policy.spec.name, policy.spec.version)
                self._report(policy.spec, f"{type(exc).__name__}: {exc}", out)
                continue
            errors = [c.last_error for c in (policy.enter, policy.exit, *policy.stage_conditions)
                      if c is not None and c.last_error]
            if errors:
                self._report(policy.spec, errors[0], out)
        self._resume_orphaned_claims(events, out)
        return out

    def _units(self, events: Sequence[FeatureEvent], out: EngineOutput) -> list[_Unit]:
        """What runs over which rows: per policy and per pool of the batch, the version for
        that pool with its overrides (and a dry-run canary beside it); highest priority
        first, so that it claims a contested knob before the others look."""
        pools = [e.target_pool() for e in events]
        by_pool: dict[str | None, np.ndarray | None]
        if len(set(pools)) == 1:
            by_pool = {pools[0]: None}
        else:
            index: dict[str | None, list[int]] = {}
            for row, pool in enumerate(pools):
                index.setdefault(pool, []).append(row)
            by_pool = {pool: np.asarray(rows) for pool, rows in index.items()}
        units = []
        for rollout in self.registry.rollouts():
            for pool, rows in by_pool.items():
                running = [(rollout.for_pool(pool), f"{rollout.name}|")]
                shadow = rollout.shadows.get(pool) if pool is not None else None
                if shadow is not None:
                    running.append((shadow, f"{rollout.name}@{pool}|"))
                for policy, prefix in running:
                    if policy is None:
                        continue
                    effective = self.pools.effective(policy.spec, pool)
                    if effective.problem is not None:
                        self._report(policy.spec, effective.problem, out, pool)
                    units.append(_Unit(policy, effective.spec, rows, prefix, effective.note))
        units.sort(key=lambda u: (-u.spec.priority, u.spec.name))
        return units

    def _report(self, spec: PolicySpec, problem: str, out: EngineOutput,
                pool: str | None = None) -> None:
        """An evaluation error, audited once per policy version (and pool version)."""
        declared = self.pools.get(pool) if pool is not None else None
        key = (spec.name, str(spec.version), str(spec.pool), pool or "",
               str(declared.version if declared else ""))
        if key in self._reported:
            return
        self._reported.add(key)
        out.decisions.append(PolicyDecision(
            policy_name=spec.name, policy_version=spec.version,
            decision=DecisionKind.EVALUATION_ERROR, detail=problem[:2048],
        ))

    def _evaluate_policy(
        self, unit: _Unit, events: Sequence[FeatureEvent], targets: list[str],
        view: FeatureView, out: EngineOutput,
    ) -> None:
        policy, spec = unit.policy, unit.spec
        if unit.rows is not None:
            view = view.subset(unit.rows)
            events = [events[row] for row in unit.rows]
            targets = [targets[row] for row in unit.rows]
        rows = len(events)
        # A feature event carries the features its input batch updated; the others keep
        # the target's last known values. An event that carries none of this policy's
        # features says nothing new about it, and a condition that cannot be told for want
        # of a feature (never reported, or older than ``max_age_s``) is not false: in both
        # cases the policy's state (a ``for:`` timer, a stage, a hold) stays as it was.
        informed = view.informed(policy.feature_names)
        columns = view.columns(policy.feature_names, spec.max_age_s)
        scoped = {**columns, **{k: np.full(rows, v) for k, v in spec.params.items()}}
        enter, known = policy.enter.evaluate(scoped, rows)
        informed &= known
        exit_ = policy.exit.holds(scoped, rows) if policy.exit is not None else ~enter
        climb = [c.holds(scoped, rows) if c is not None else None
                 for c in policy.stage_conditions]
        selector = spec.selector
        top = len(policy.stage_conditions)
        everyone = selector == type(selector)()
        prefix = unit.prefix
        states = self.states
        acts_on_workers = spec.tune is None
        for row, event in enumerate(events):
            if not informed[row]:
                continue
            # A pool's or a job's features describe no worker to command.
            if acts_on_workers and event.scope != "worker":
                continue
            key = prefix + targets[row]
            if not enter[row] and key not in states:
                continue
            if not everyone and not selector.matches(event.identity.job_id, event.tags):
                continue
            old = states.get(key, _IDLE)
            if old.stage > top:  # a new version with fewer stages
                old = replace(old, stage=top)
            next_stage = 0 if spec.one_shot else min(old.stage, len(climb) - 1)
            condition = climb[next_stage] if climb else None
            climb_holds = condition[row] if condition is not None else True
            new, kind = decide(spec, old, bool(enter[row]), event.event_time_ms,
                               exit_holds=bool(exit_[row]), climb_holds=bool(climb_holds),
                               cooldown_floor_s=self.limits.cooldown_floor_s)
            resolved = False
            if spec.alert and spec.one_shot:
                if kind is DecisionKind.FIRED:
                    new = replace(new, alert_open=True)
                elif old.alert_open and not enter[row]:
                    new, resolved = replace(new, alert_open=False), True
            if new != old:
                if new == _IDLE:
                    states.pop(key, None)
                else:
                    states[key] = new
            if kind is None and not resolved:
                continue
            seen = view.seen(row, policy.feature_names)
            if kind is not None:
                self._act(unit, event, old, new, kind, seen, out)
            if resolved:
                values = _values(seen)
                alert = render_alert(spec.alert or "", spec, event, values)
                out.decisions.append(_decision(spec, event, DecisionKind.RESOLVED, 0,
                                               f"alert {alert}; the condition no longer holds",
                                               features=values))

    def _act(
        self, unit: _Unit, event: FeatureEvent, old: PolicyState,
        new: PolicyState, kind: DecisionKind, seen: dict[str, tuple[float, float]],
        out: EngineOutput,
    ) -> None:
        """``seen``: the values the condition saw, by name, with their ages in seconds."""
        spec = unit.spec
        detail = ", ".join(
            f"{name}={value:g}" + (f" ({age_s:g} s old)" if age_s > 0 else "")
            for name, (value, age_s) in seen.items()
        )
        values = _values(seen)
        if spec.alert:
            detail = f"alert {render_alert(spec.alert, spec, event, values)}; {detail}"

        def audit(decision: DecisionKind, stage: int, text: str,
                  actuation: str | None = None) -> None:
            out.decisions.append(_decision(spec, event, decision, stage, text, actuation,
                                           values))

        if kind is DecisionKind.SUPPRESSED_COOLDOWN:
            cooldown_ms = s_to_ms(cooldown_s(spec, self.limits.cooldown_floor_s))
            audit(kind, new.stage, f"cooling down until "
                  f"{(old.last_fired_ms or 0) + cooldown_ms}; {detail}")
            return
        if spec.tune is not None:
            self._tuner.tune(spec, event, kind, audit, detail, out)
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
        if undo:
            undo_by_kind = {a.kind: a for a in actions}
            released = [a.kind for a in spec.stage_actions(stage - 1)]
            kinds = list(dict.fromkeys([*released, *undo_by_kind]))
            grants = [self._knobs.release(spec, event, k, undo_by_kind.get(k)) for k in kinds]
        else:
            grants = [self._knobs.claim(spec, event, action) for action in actions]
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
            pool_note = f" ({unit.note})" if unit.note and owner.name == spec.name else ""
            command = self._command(
                owner, event, action,
                (spec.name, stage, said, event.event_time_ms, index),
                f"{spec.name} v{spec.version}{pool_note} {said} stage {stage}{how}: "
                f"{spec.condition}")
            out.commands.append(command)
            audit(kind, new.stage, f"{said} stage {stage}: {action.kind}{how}; {detail}",
                  command.actuation_id)

    def _command(self, owner: PolicySpec, event: FeatureEvent, action: ActionParams,
                 cause: tuple[object, ...], reason: str) -> ActuationCommand:
        """The signed command for ``owner``'s ``action`` on the event's worker; its id
        derives from the owner, the worker and ``cause``."""
        return self._signer.sign(ActuationCommand(
            actuation_id=actuation_id(owner.name, owner.version, event.identity.job_id,
                                      event.identity.worker_id, *cause),
            event_time_ms=event.event_time_ms,
            target=event.identity,
            expires_at_ms=event.event_time_ms + s_to_ms(owner.ttl_s),
            policy_name=owner.name,
            policy_version=owner.version,
            action=action,
            reason=reason[:1024],
        ))

    def _within_budget(self, event: FeatureEvent) -> bool:
        worker = f"{event.identity.job_id}|{event.identity.worker_id}"
        return self._budget.admit(worker, event.event_time_ms)

    @property
    def _over_budget(self) -> str:
        return (f"the worker had {self._budget.per_min} commands in the last 60 s "
                "(commands_per_worker_per_min)")

    def _resume_orphaned_claims(self, events: Sequence[FeatureEvent], out: EngineOutput) -> None:
        """Claims left deferred behind one that lapsed or whose policy was deleted take
        effect at their target's next feature event (see ``KnobBoard.resume_orphaned``)."""
        if not self.knobs:
            return
        seen: set[str] = set()
        for event in events:
            target = f"{event.identity.job_id}|{event.identity.worker_id}"
            if target in seen:
                continue
            seen.add(target)
            for kind in OWNED_KINDS:
                resumed = self._knobs.resume_orphaned(event, kind)
                if resumed is None:
                    continue
                owner, action = resumed
                if not self._within_budget(event):
                    out.decisions.append(PolicyDecision(
                        event_time_ms=event.event_time_ms, policy_name=owner.name,
                        policy_version=owner.version, identity=event.identity,
                        decision=DecisionKind.SUPPRESSED_RATE_LIMIT,
                        detail=f"resume {kind} not sent, {self._over_budget}",
                    ))
                    continue
                command = self._command(
                    owner, event, action, ("resume", kind, event.event_time_ms),
                    f"{owner.name} v{owner.version} resumes {kind}: the claim above it "
                    "expired or its policy was removed")
                out.commands.append(command)
                out.decisions.append(PolicyDecision(
                    event_time_ms=event.event_time_ms, policy_name=owner.name,
                    policy_version=owner.version, identity=event.identity,
                    decision=DecisionKind.FIRED, actuation_id=command.actuation_id,
                    detail=f"resumes {kind}: the claim above it lapsed",
                ))
