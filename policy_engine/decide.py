"""The per (policy, target) state machine: ``for:`` duration, then fire, then cooldown.

Pure: state in, decision and new state out; time is the event time given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsec.schemas.policies import DecisionKind, PolicySpec


@dataclass(frozen=True)
class PolicyState:
    pending_since_ms: int | None = None
    last_fired_ms: int | None = None
    suppressed_audited: bool = False

    def to_json(self) -> dict:
        return {
            "pending_since_ms": self.pending_since_ms,
            "last_fired_ms": self.last_fired_ms,
            "suppressed_audited": self.suppressed_audited,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> PolicyState:
        if not data:
            return cls()
        return cls(
            pending_since_ms=data.get("pending_since_ms"),
            last_fired_ms=data.get("last_fired_ms"),
            suppressed_audited=bool(data.get("suppressed_audited", False)),
        )


def decide(
    policy: PolicySpec, state: PolicyState, condition_holds: bool, now_ms: int
) -> tuple[PolicyState, DecisionKind | None]:
    """What the engine does now; ``None`` means nothing worth an audit record."""
    if not condition_holds:
        return replace(state, pending_since_ms=None, suppressed_audited=False), None
    pending_since = state.pending_since_ms if state.pending_since_ms is not None else now_ms
    state = replace(state, pending_since_ms=pending_since)
    if now_ms - pending_since < policy.for_s * 1000:
        return state, None
    cooling = (
        state.last_fired_ms is not None
        and now_ms - state.last_fired_ms < policy.cooldown_s * 1000
    )
    if cooling:
        if state.suppressed_audited:
            return state, None
        return replace(state, suppressed_audited=True), DecisionKind.SUPPRESSED_COOLDOWN
    fired = replace(state, last_fired_ms=now_ms, suppressed_audited=False)
    return fired, DecisionKind.DRY_RUN if policy.dry_run else DecisionKind.FIRED
