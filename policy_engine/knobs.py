"""Knob arbitration. Per (target, knob) the engine keeps every policy's claim and which one
is in effect: the highest priority (a tie keeps the one in effect). A claim outranked now
is kept, and takes effect when the claims above it are released. One-shot policies have
no undo: their claim lasts as long as their command is valid."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter

from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import ActionKind, FeatureEvent
from dsec.schemas.actuations import ActionParams
from dsec.schemas.policies import PolicySpec
from dsec.schemas.units import s_to_ms

__all__ = [
    "OWNED_KINDS", "Grant", "KnobBoard", "KnobClaim", "KnobEntry", "knob_key",
]

# Triggers, not settings: two policies asking for one conflict with nothing.
_UNOWNED_KINDS = {ActionKind.SNAPSHOT}
OWNED_KINDS = tuple(kind for kind in ActionKind if kind not in _UNOWNED_KINDS)
_ACTION: TypeAdapter[ActionParams] = TypeAdapter(ActionParams)

# What a claim or a release lets through: the policy the command is sent for, the action,
# and how it came about (text for the audit record); a string where nothing is sent, why.
Grant = tuple[PolicySpec, ActionParams, str]


def knob_key(event: FeatureEvent, kind: str) -> str:
    return f"{event.identity.job_id}|{event.identity.worker_id}|{kind}"


@dataclass(frozen=True)
class KnobClaim:
    """``until_ms``: event time the claim lapses at (a one-shot policy's); None: until
    released."""

    priority: int
    until_ms: int | None
    action: ActionParams

    def to_json(self) -> dict[str, Any]:
        return {"priority": self.priority, "until_ms": self.until_ms,
                "action": self.action.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KnobClaim:
        return cls(priority=data["priority"], until_ms=data.get("until_ms"),
                   action=_ACTION.validate_python(data["action"]))


@dataclass(frozen=True)
class KnobEntry:
    """One knob of one target: the claims by policy name, in the order they were first
    made, and the name of the one in effect."""

    claims: dict[str, KnobClaim] = field(default_factory=dict)
    applied: str | None = None

    def top(self) -> str | None:
        claims = self.claims
        if not claims:
            return None
        return max(claims, key=lambda n: (claims[n].priority, n == self.applied))

    def to_json(self) -> dict[str, Any]:
        return {"claims": {name: claim.to_json() for name, claim in self.claims.items()},
                "applied": self.applied}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KnobEntry:
        return cls(claims={name: KnobClaim.from_json(claim)
                           for name, claim in data.get("claims", {}).items()},
                   applied=data.get("applied"))


class KnobBoard:
    """The knob entries (``knobs``: by ``knob_key``) and the claims' rules over them."""

    def __init__(self, knobs: MutableMapping[str, KnobEntry], registry: PolicyRegistry) -> None:
        self.knobs = knobs
        self.registry = registry

    def _entry(self, event: FeatureEvent, kind: str) -> tuple[str, KnobEntry]:
        """The entry with only its live claims: their policy still installed, not lapsed."""
        key = knob_key(event, kind)
        entry = self.knobs.get(key) or KnobEntry()
        now = event.event_time_ms
        pool = event.target_pool()
        claims = {
            name: claim for name, claim in entry.claims.items()
            if self.registry.get(name, pool) is not None
            and now < (claim.until_ms or float("inf"))
        }
        return key, KnobEntry(claims, entry.applied if entry.applied in claims else None)

    def _store(self, key: str, entry: KnobEntry) -> None:
        if entry.claims:
            self.knobs[key] = entry
        else:
            self.knobs.pop(key, None)

    def claim(self, spec: PolicySpec, event: FeatureEvent, action: ActionParams) -> Grant | str:
        if action.kind in _UNOWNED_KINDS:
            return spec, action, ""
        key, entry = self._entry(event, action.kind)
        until_ms = event.event_time_ms + s_to_ms(spec.ttl_s) if spec.one_shot else None
        entry = replace(entry, claims={
            **entry.claims, spec.name: KnobClaim(spec.priority, until_ms, action)})
        top = entry.top()
        if top == spec.name:
            entry = replace(entry, applied=spec.name)
        self._store(key, entry)
        if top == spec.name:
            return spec, action, ""
        assert top is not None
        return (f"apply {action.kind}: deferred, held by {top} (priority "
                f"{entry.claims[top].priority})")

    def release(self, spec: PolicySpec, event: FeatureEvent, kind: str,
                undo: ActionParams | None) -> Grant | str | None:
        if kind in _UNOWNED_KINDS:
            return (spec, undo, "") if undo is not None else None
        key, entry = self._entry(event, kind)
        in_effect = entry.applied == spec.name
        entry = replace(entry, claims={
            name: claim for name, claim in entry.claims.items() if name != spec.name})
        if not in_effect:
            self._store(key, entry)
            return f"undo {kind}: was not in effect, held by {entry.applied or 'nobody'}"
        top = entry.top()
        entry = replace(entry, applied=top)
        self._store(key, entry)
        if top is None:
            return (spec, undo, "") if undo is not None else None
        owner = self.registry.get(top, event.target_pool())
        assert owner is not None  # only installed policies' claims are live
        return owner, entry.claims[top].action, f" (resumes {top})"

    def in_force(self, key: str, now_ms: int, pool: str | None) -> bool:
        """Whether the entry under ``key`` has nothing to hand on: no entry, or the claim in
        effect is still live (its policy installed, not lapsed)."""
        entry = self.knobs.get(key)
        if entry is None:
            return True
        claim = entry.claims.get(entry.applied) if entry.applied is not None else None
        return (claim is not None and now_ms < (claim.until_ms or float("inf"))
                and self.registry.get(entry.applied, pool) is not None)

    def resume_orphaned(self, event: FeatureEvent, kind: str) -> tuple[PolicySpec,
                                                                       ActionParams] | None:
        """A claim deferred behind one that has since lapsed, or whose policy was deleted,
        takes effect at its target's next feature event: the holder never undoes, so
        nothing else would hand the knob on. Returns the owner and action to send."""
        if knob_key(event, kind) not in self.knobs:
            return None
        key, entry = self._entry(event, kind)
        top = entry.top() if entry.applied is None else None
        entry = replace(entry, applied=top or entry.applied)
        self._store(key, entry)
        owner = self.registry.get(top, event.target_pool()) if top is not None else None
        if owner is None or top is None:
            return None
        return owner, entry.claims[top].action
