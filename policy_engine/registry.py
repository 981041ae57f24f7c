"""The policies the engine runs: checked, signature-verified, compiled, versioned.

Policies arrive from the built-in pack and from the compacted policies topic. A policy
that does not parse, is unsigned or tampered with, or whose conditions do not compile is
rejected with a reason fit for the audit log; the ones already running carry on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from dsec.policy_engine.conditions import ConditionError
from dsec.policy_engine.vectorised import VectorCondition
from dsec.schemas import PolicyDecision, PolicySpec, SignatureError, verify
from dsec.schemas.codec import describe
from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES
from dsec.schemas.policies import DecisionKind

MAX_POLICY_BYTES = 64 * 1024
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_.:\-/]")


class PolicyRejected(ValueError):
    """A policy the engine will not run; ``reason`` goes to the audit log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_policy(text: str | bytes) -> PolicySpec:
    """A policy from YAML or JSON text (JSON is YAML); never evaluates anything in it."""
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyRejected(f"policy larger than {MAX_POLICY_BYTES} bytes")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyRejected(f"not YAML or JSON: {exc}") from None
    if not isinstance(document, dict):
        raise PolicyRejected("a policy is a mapping")
    try:
        return PolicySpec.model_validate(document)
    except ValidationError as exc:
        raise PolicyRejected(f"invalid policy: {describe(exc)}") from None


@dataclass(frozen=True)
class CompiledPolicy:
    spec: PolicySpec
    enter: VectorCondition
    exit: VectorCondition | None
    stage_conditions: tuple[VectorCondition | None, ...]

    @property
    def feature_names(self) -> frozenset[str]:
        conditions = [self.enter, self.exit, *self.stage_conditions]
        names = frozenset().union(*(c.names for c in conditions if c is not None))
        return names - self.spec.params.keys()


def compile_policy(spec: PolicySpec) -> CompiledPolicy:
    shadowed = sorted(spec.params.keys() & (WORKER_FEATURES.keys() | FLEET_FEATURES.keys()))
    if shadowed:
        raise PolicyRejected(f"parameters shadow features: {', '.join(shadowed)}")
    try:
        return CompiledPolicy(
            spec=spec,
            enter=VectorCondition(spec.condition),
            exit=VectorCondition(spec.exit_condition) if spec.exit_condition else None,
            stage_conditions=tuple(
                VectorCondition(stage.condition) if stage.condition else None
                for stage in spec.effective_stages()
            ),
        )
    except ConditionError as exc:
        raise PolicyRejected(str(exc)) from None


def _audit_name(name: str) -> str:
    return _NOT_IDENTIFIER.sub("_", name)[:128] or "unnamed"


class PolicyRegistry:
    """Name → the running version, plus every version seen (for ``dsec policy list``)."""

    def __init__(self, signing_key: bytes) -> None:
        self._signing_key = signing_key
        self._active: dict[str, CompiledPolicy] = {}
        self._versions: dict[str, dict[int, PolicySpec]] = {}
        self.generation = 0

    def active(self) -> list[CompiledPolicy]:
        """Highest priority first: it claims a contested knob before the others look."""
        return sorted(self._active.values(), key=lambda c: (-c.spec.priority, c.spec.name))

    def get(self, name: str) -> PolicySpec | None:
        compiled = self._active.get(name)
        return compiled.spec if compiled else None

    def versions(self, name: str) -> list[int]:
        return sorted(self._versions.get(name, {}))

    def install(self, spec: PolicySpec) -> PolicyDecision | None:
        """Verify and run ``spec``; ``None`` when it is the version already running."""
        try:
            verify(spec, self._signing_key)
        except SignatureError as exc:
            return self._rejected(spec.name, spec.version, f"signature: {exc}")
        current = self._active.get(spec.name)
        if current is not None:
            if spec.version == current.spec.version and spec == current.spec:
                return None
            if spec.version <= current.spec.version:
                return self._rejected(
                    spec.name, spec.version,
                    f"version {spec.version} is not newer than {current.spec.version}",
                )
        try:
            compiled = compile_policy(spec)
        except PolicyRejected as exc:
            return self._rejected(spec.name, spec.version, exc.reason)
        self._active[spec.name] = compiled
        self._versions.setdefault(spec.name, {})[spec.version] = spec
        self.generation += 1
        uncovered = [c.not_covered for c in (compiled.enter, compiled.exit) if c and c.not_covered]
        note = f" (row by row in cel-python: {uncovered[0]})" if uncovered else ""
        return PolicyDecision(
            policy_name=spec.name, policy_version=spec.version,
            decision=DecisionKind.POLICY_ACCEPTED,
            detail=f"running v{spec.version}{' in dry-run' if spec.dry_run else ''}{note}",
        )

    def offer(self, key: bytes | None, value: bytes | None) -> PolicyDecision | None:
        """One record of the policies topic: a policy, or a tombstone that deletes one."""
        name = (key or b"").decode("utf-8", "replace")
        if value is None:
            removed = self._active.pop(name, None)
            if removed is None:
                return None
            self.generation += 1
            return PolicyDecision(
                policy_name=_audit_name(name), policy_version=removed.spec.version,
                decision=DecisionKind.POLICY_DELETED, detail="tombstone on the policies topic",
            )
        try:
            spec = parse_policy(value)
        except PolicyRejected as exc:
            return self._rejected(name, 0, exc.reason)
        if spec.name != name:
            return self._rejected(name, spec.version, f"keyed {name!r} but named {spec.name!r}")
        return self.install(spec)

    @staticmethod
    def _rejected(name: str, version: int, reason: str) -> PolicyDecision:
        return PolicyDecision(
            policy_name=_audit_name(name), policy_version=max(version, 0),
            decision=DecisionKind.POLICY_REJECTED, detail=reason[:2048],
        )
