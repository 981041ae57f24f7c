"""One evaluation step: a batch of feature events in; commands, audit records and tuned
policy and pool versions out. Pure apart from the two state mappings it is given, per
(policy, target) ``PolicyState``s and per (target, knob) ``KnobEntry``s (Faust tables in
the stream job, dicts offline and in tests).

The batch is taken to columns (``FeatureBatch``) and conditions are evaluated for the
whole batch at once (numpy), or once per pool where the batch's targets run in several:
each pool's workers run the policy version for their pool (a canary, else the fleet's)
with the pool's parameter overrides. The per-target state machine then runs only for rows
whose condition holds or whose policy is not idle, and of those only for the rows a column
check cannot show it would leave as they are (``state_columns.settled``). The state
mapping is written only by the engine; ``forget_cached`` makes it read again (after a
rebalance, or a change made behind the engine's back).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dsec.policy_engine.decide import PolicyState, cooldown_s, decide
from dsec.policy_engine.decision_records import (
    actuation_id,
    decision_record,
    render_alert,
    values_seen,
)
from dsec.policy_engine.feature_batch import FeatureBatch, TargetSlots
from dsec.policy_engine.feature_memory import (
    FeatureMemory,
    FeatureView,
    KnownFeatures,
    occurrences,
    repeated_rows,
)
from dsec.policy_engine.jitter import cooldown_jitter_ms
from dsec.policy_engine.knobs import OWNED_KINDS, KnobBoard, KnobEntry, knob_key
from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.rate_limit import CommandBudget
from dsec.policy_engine.registry import CompiledPolicy, PolicyRegistry
from dsec.policy_engine.state_columns import StateBoard, Timing, settled
from dsec.policy_engine.tuning import Tuner, tuned
from dsec.schemas import ActuationCommand, FeatureEvent, PolicyDecision, Signer
from dsec.schemas.actuations import ActionParams
from dsec.schemas.policies import DecisionKind, PolicySpec
from dsec.schemas.pools import PoolSpec
from dsec.schemas.units import s_to_ms

__all__ = ["Engine", "EngineOutput", "actuation_id", "knob_key", "render_alert", "tuned"]

log = logging.getLogger(__name__)
_IDLE = PolicyState()
_KIND_ORDER = {f"{kind}": index for index, kind in enumerate(OWNED_KINDS)}


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
    timing: Timing


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
        self._slots = TargetSlots()
        self.memory = FeatureMemory({} if known is None else known, self._slots)
        self._board = StateBoard(states, self._slots.targets)
        self._knobs = KnobBoard(knobs, registry)
        self._signer = signer
        self._tuner = Tuner(registry, self.pools, signer)
        self._reported: set[tuple[str, ...]] = set()
        self.limits = registry.limits
        self._budget = CommandBudget(self.limits.commands_per_worker_per_min)

    def forget_cached(self) -> None:
        """Read states and known features from their mappings again, target by target."""
        self.memory.forget_cached()
        self._board.forget_cached()

    def evaluate(self, events: Sequence[FeatureEvent]) -> EngineOutput:
        return self.evaluate_batch(FeatureBatch.from_events(events))

    def evaluate_batch(self, batch: FeatureBatch) -> EngineOutput:
        out = EngineOutput()
        if not len(batch):
            return out
        slots = self._slots.slots(batch.targets)
        repeated = repeated_rows(slots)
        if not repeated.any():
            self._evaluate_rows(batch, slots, out)
            return out
        # A target met more than once (a backlog, a burst): each target's first row in a
        # first pass, its second in a second, and so on. No pass meets a target twice, so
        # each runs column-wise, and a target's later rows see the state its earlier ones
        # leave.
        for rows in occurrences(slots, repeated):
            self._evaluate_rows(batch.take(rows), slots[rows], out)
        return out

    def _evaluate_rows(self, batch: FeatureBatch, slots: np.ndarray,
                       out: EngineOutput) -> None:
        """A batch that meets each target once (``slots``: its targets' slots)."""
        units = self._units(batch.pools, out)
        names = frozenset().union(*(u.policy.feature_names for u in units))
        view = self.memory.view(batch, names, slots,
                                repeated=np.zeros(len(batch), dtype=bool))  # none, by contract
        self._budget.forget_idle(int(batch.event_times_ms.max()))
        for unit in units:
            policy = unit.policy
            try:
                self._evaluate_policy(unit, batch, slots, view, out)
            except Exception as exc:  # one broken policy must not stop the others
                log.exception("policy %s v%s failed", policy.spec.name, policy.spec.version)
                self._report(policy.spec, f"{type(exc).__name__}: {exc}", out)
                continue
            errors = [c.last_error for c in (policy.enter, policy.exit, *policy.stage_conditions)
                      if c is not None and c.last_error]
            if errors:
                self._report(policy.spec, errors[0], out)
        self._resume_orphaned_claims(batch, slots, out)

    def _units(self, pools: list[str | None], out: EngineOutput) -> list[_Unit]:
        """What runs over which rows: per policy and per pool of the batch (``pools``, each
        row's), the version for that pool with its overrides (and a dry-run canary beside
        it); highest priority first, so that it claims a contested knob before the others
        look."""
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
                    units.append(_Unit(policy, effective.spec, rows, prefix, effective.note,
                                       Timing.of(effective.spec, self.limits.cooldown_floor_s)))
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
        self, unit: _Unit, batch: FeatureBatch, slots: np.ndarray, view: FeatureView,
        out: EngineOutput,
    ) -> None:
        policy, spec = unit.policy, unit.spec
        rows = np.arange(len(batch)) if unit.rows is None else unit.rows
        if unit.rows is not None:
            view = view.subset(unit.rows)
            slots = slots[unit.rows]
        count = rows.size
        # A feature event carries the features its input batch updated; the others keep
        # the target's last known values. An event that carries none of this policy's
        # features says nothing new about it, and a condition that cannot be told for want
        # of a feature (never reported, or older than ``max_age_s``) is not false: in both
        # cases the policy's state (a ``for:`` timer, a stage, a hold) stays as it was.
        informed = view.informed(policy.feature_names)
        columns = view.columns(policy.feature_names, spec.max_age_s)
        scoped = {**columns, **{k: np.full(count, v) for k, v in spec.params.items()}}
        enter, known = policy.enter.evaluate(scoped, count)
        informed &= known
        # A pool's or a job's features describe no worker to command.
        if spec.tune is None:
            informed &= batch.worker_scope[rows]
        board = self._board.columns(unit.prefix)
        board.load(slots)
        candidates = informed & (enter | board.present[slots])
        if not candidates.any():
            return
        exit_ = policy.exit.holds(scoped, count) if policy.exit is not None else ~enter
        climb = [c.holds(scoped, count) if c is not None else None
                 for c in policy.stage_conditions]
        first_climb = climb[0] if climb and climb[0] is not None else True
        picked = np.flatnonzero(candidates)
        timing = unit.timing
        gathered = board.gather(slots[picked])
        jitter_ms = (cooldown_jitter_ms(self._slots.hashes(slots[picked]),
                                        gathered.last_fired_ms, timing.jitter_ms)
                     if timing.jitter_ms > 0 else np.zeros(picked.size, dtype=np.int64))
        quiet = settled(timing, gathered, enter[picked], (enter & first_climb)[picked],
                        exit_[picked], view.event_times_ms[picked], len(climb), jitter_ms)
        selector = spec.selector
        top = len(policy.stage_conditions)
        everyone = selector == type(selector)()
        states = self.states
        for local, extra_ms in zip(picked[~quiet].tolist(), jitter_ms[~quiet].tolist(),
                                   strict=True):
            event = batch.event(int(rows[local]))
            if not everyone and not selector.matches(event.identity.job_id, event.tags):
                continue
            key = unit.prefix + batch.targets[int(rows[local])]
            old = states.get(key, _IDLE)
            if old.stage > top:  # a new version with fewer stages
                old = replace(old, stage=top)
            next_stage = 0 if timing.one_shot else min(old.stage, len(climb) - 1)
            condition = climb[next_stage] if climb else None
            climb_holds = condition[local] if condition is not None else True
            new, kind = decide(spec, old, bool(enter[local]), event.event_time_ms,
                               exit_holds=bool(exit_[local]), climb_holds=bool(climb_holds),
                               cooldown_floor_s=self.limits.cooldown_floor_s,
                               cooldown_jitter_ms=extra_ms)
            resolved = False
            if timing.resolves_alerts:
                if kind is DecisionKind.FIRED:
                    new = replace(new, alert_open=True)
                elif old.alert_open and not enter[local]:
                    new, resolved = replace(new, alert_open=False), True
            if new != old:
                if new == _IDLE:
                    states.pop(key, None)
                    board.put(int(slots[local]), None)
                else:
                    states[key] = new
                    board.put(int(slots[local]), new)
            if kind is None and not resolved:
                continue
            seen = view.seen(local, policy.feature_names)
            if kind is not None:
                self._act(unit, event, old, new, kind, seen, out, extra_ms)
            if resolved:
                values = values_seen(seen)
                alert = render_alert(spec.alert or "", spec, event, values)
                out.decisions.append(decision_record(spec, event, DecisionKind.RESOLVED, 0,
                                               f"alert {alert}; the condition no longer holds",
                                               features=values))

    def _act(
        self, unit: _Unit, event: FeatureEvent, old: PolicyState,
        new: PolicyState, kind: DecisionKind, seen: dict[str, tuple[float, float]],
        out: EngineOutput, cooldown_jitter_ms: int = 0,
    ) -> None:
        """``seen``: the values the condition saw, by name, with their ages in seconds;
        ``cooldown_jitter_ms``: the target's draw of the policy's ``jitter_s``."""
        spec = unit.spec
        detail = ", ".join(
            f"{name}={value:g}" + (f" ({age_s:g} s old)" if age_s > 0 else "")
            for name, (value, age_s) in seen.items()
        )
        values = values_seen(seen)
        if spec.alert:
            detail = f"alert {render_alert(spec.alert, spec, event, values)}; {detail}"

        def audit(decision: DecisionKind, stage: int, text: str,
                  actuation: str | None = None) -> None:
            out.decisions.append(decision_record(spec, event, decision, stage, text, actuation,
                                           values))

        if kind is DecisionKind.SUPPRESSED_COOLDOWN:
            cooldown_ms = (s_to_ms(cooldown_s(spec, self.limits.cooldown_floor_s))
                           + cooldown_jitter_ms)
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

    def _resume_orphaned_claims(self, batch: FeatureBatch, slots: np.ndarray,
                                out: EngineOutput) -> None:
        """Claims left deferred behind one that lapsed or whose policy was deleted take
        effect at their target's next feature event (see ``KnobBoard.resume_orphaned``).
        ``slots``: the batch's target slots."""
        if not self.knobs:
            return
        claimed: dict[str, list[str]] = {}
        for key in self.knobs:
            target, kind = key.rsplit("|", 1)
            claimed.setdefault(target, []).append(kind)
        # The first row of each claimed target in the batch, in row order.
        rows = np.flatnonzero(np.isin(slots, self._slots.existing(claimed)))
        _, first = np.unique(slots[rows], return_index=True)
        for row in np.sort(rows[first]).tolist():
            target = batch.targets[row]
            kinds = claimed[target]
            now_ms, pool = int(batch.event_times_ms[row]), batch.pools[row]
            orphaned = [kind for kind in sorted(kinds, key=_KIND_ORDER.get)
                        if not self._knobs.in_force(f"{target}|{kind}", now_ms, pool)]
            if not orphaned:
                continue
            event = batch.event(row)
            for kind in orphaned:
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
