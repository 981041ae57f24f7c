"""The per (policy, target) state machine: ``for:`` duration, cooldown, and staged actions
that climb while the condition holds and come down, one stage per ``hold_s``, once the
exit condition has held that long (hysteresis).

Pure: state in, decision and new state out; time is the event time given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsec.schemas.policies import DecisionKind, PolicySpec
from dsec.schemas.units import duration_ms


@dataclass(frozen=True)
class PolicyState:
    pending_since_ms: int | None = None
    last_fired_ms: int | None = None
    suppressed_audited: bool = False
    stage: int = 0
    stage_since_ms: int | None = None
    clear_since_ms: int | None = None
    # A policy that fires once per cooldown raised its alert for the target, and the
    # condition has held since: its clearing resolves the alert.
    alert_open: bool = False

    def to_json(self) -> dict:
        return {
            "pending_since_ms": self.pending_since_ms,
            "last_fired_ms": self.last_fired_ms,
            "suppressed_audited": self.suppressed_audited,
            "stage": self.stage,
            "stage_since_ms": self.stage_since_ms,
            "clear_since_ms": self.clear_since_ms,
            "alert_open": self.alert_open,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> PolicyState:
        if not data:
            return cls()
        return cls(
            pending_since_ms=data.get("pending_since_ms"),
            last_fired_ms=data.get("last_fired_ms"),
            suppressed_audited=bool(data.get("suppressed_audited", False)),
            stage=int(data.get("stage", 0)),
            stage_since_ms=data.get("stage_since_ms"),
            clear_since_ms=data.get("clear_since_ms"),
            alert_open=bool(data.get("alert_open", False)),
        )


def cooldown_s(policy: PolicySpec, floor_s: float) -> float:
    """The policy's cooldown, never under the installation's floor."""
    return max(policy.cooldown_s, floor_s)


def _outcome(policy: PolicySpec, kind: DecisionKind) -> DecisionKind:
    return DecisionKind.DRY_RUN if policy.dry_run else kind


def _idle(
    policy: PolicySpec, state: PolicyState, holds: bool, now_ms: int, cooldown_floor_s: float,
    cooldown_jitter_ms: int,
) -> tuple[PolicyState, DecisionKind | None]:
    if not holds:
        return replace(state, pending_since_ms=None, suppressed_audited=False), None
    pending_since = state.pending_since_ms if state.pending_since_ms is not None else now_ms
    state = replace(state, pending_since_ms=pending_since)
    if now_ms - pending_since < duration_ms(policy.for_s):
        return state, None
    cooling = (
        state.last_fired_ms is not None
        and now_ms - state.last_fired_ms
        < duration_ms(cooldown_s(policy, cooldown_floor_s)) + cooldown_jitter_ms
    )
    if cooling:
        if state.suppressed_audited:
            return state, None
        return replace(state, suppressed_audited=True), DecisionKind.SUPPRESSED_COOLDOWN
    fired = replace(state, last_fired_ms=now_ms, suppressed_audited=False)
    if not policy.one_shot:
        fired = replace(fired, pending_since_ms=None, stage=1, stage_since_ms=now_ms,
                        clear_since_ms=None)
    return fired, _outcome(policy, DecisionKind.FIRED)


def _active(
    policy: PolicySpec, state: PolicyState, holds: bool, exit_holds: bool, climb_holds: bool,
    now_ms: int,
) -> tuple[PolicyState, DecisionKind | None]:
    if holds:
        state = replace(state, clear_since_ms=None)
        stage_since = state.stage_since_ms if state.stage_since_ms is not None else now_ms
        top = len(policy.effective_stages())
        due = now_ms - stage_since >= duration_ms(policy.stage_interval_s)
        if state.stage < top and climb_holds and due:
            return (replace(state, stage=state.stage + 1, stage_since_ms=now_ms),
                    _outcome(policy, DecisionKind.STAGED_UP))
        return state, None
    if not exit_holds:
        # Inside the hysteresis band: neither climb nor count towards coming down.
        return replace(state, clear_since_ms=None), None
    clear_since = state.clear_since_ms if state.clear_since_ms is not None else now_ms
    if now_ms - clear_since < duration_ms(policy.hold_s):
        return replace(state, clear_since_ms=clear_since), None
    stage = state.stage - 1
    if stage == 0:
        down = replace(state, stage=0, stage_since_ms=None, clear_since_ms=None,
                       pending_since_ms=None, suppressed_audited=False)
    else:
        down = replace(state, stage=stage, stage_since_ms=now_ms, clear_since_ms=now_ms)
    return down, _outcome(policy, DecisionKind.STAGED_DOWN)


def decide(
    policy: PolicySpec,
    state: PolicyState,
    condition_holds: bool,
    now_ms: int,
    exit_holds: bool | None = None,
    climb_holds: bool = True,
    cooldown_floor_s: float = 0.0,
    cooldown_jitter_ms: int = 0,
) -> tuple[PolicyState, DecisionKind | None]:
    """What the engine does now; ``None`` means nothing worth an audit record.

    The stage moves by at most one per call: ``new.stage`` above the old one applies that
    stage's actions, below it undoes the old stage's. ``exit_holds`` defaults to the
    condition not holding; ``climb_holds`` is the next stage's own condition, if it has one.
    The cooldown is the policy's ``cooldown_s``, or ``cooldown_floor_s`` when that is longer,
    plus ``cooldown_jitter_ms`` (the target's draw of the policy's ``jitter_s``).
    """
    if exit_holds is None:
        exit_holds = not condition_holds
    if policy.one_shot or state.stage == 0:
        return _idle(policy, state, condition_holds and climb_holds, now_ms, cooldown_floor_s,
                     cooldown_jitter_ms)
    return _active(policy, state, condition_holds, exit_holds, climb_holds, now_ms)
