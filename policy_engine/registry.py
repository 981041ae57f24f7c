"""The policies the engine runs: checked, signature-verified, compiled, versioned.

Policies arrive from the built-in pack (part of the installed code, so trusted as it is)
and from the compacted policies topic. A policy from the topic that does not parse, is
unsigned, tampered with or signed by a key not trusted to publish it, or whose conditions
are out of bounds or do not compile is rejected with a reason fit for the audit log,
whatever the failure; the ones already running carry on. Only a signed deletion record
deletes a policy. A pool-publisher's key publishes, replaces and deletes only policies
confined to its pools, so a pool's owner cannot narrow or stop a fleet-wide policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from dsec.policy_engine.condition_check import ConditionLimits, check_condition
from dsec.policy_engine.conditions import ConditionError
from dsec.policy_engine.limits import PolicyLimits
from dsec.policy_engine.vectorised import VectorCondition
from dsec.schemas import (
    PolicyDecision,
    PolicyDeletion,
    PolicySpec,
    SignatureError,
    SignedBy,
    Verifier,
)
from dsec.schemas.codec import describe
from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES
from dsec.schemas.policies import DecisionKind
from dsec.schemas.trust import KeyRole

MAX_POLICY_BYTES = 64 * 1024
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_.:\-/]")


class PolicyRejected(ValueError):
    """A policy the engine will not run; ``reason`` goes to the audit log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _document(text: str | bytes) -> dict:
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyRejected(f"policy larger than {MAX_POLICY_BYTES} bytes")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyRejected(f"not YAML or JSON: {exc}") from None
    except Exception as exc:  # e.g. nesting too deep for the composer
        raise PolicyRejected(f"not YAML or JSON: {type(exc).__name__}") from None
    if not isinstance(document, dict):
        raise PolicyRejected("a policy is a mapping")
    return document


def _validated(model: type[PolicySpec] | type[PolicyDeletion], document: dict):
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        what = "policy" if model is PolicySpec else "policy deletion"
        raise PolicyRejected(f"invalid {what}: {describe(exc)}") from None


def parse_policy(text: str | bytes) -> PolicySpec:
    """A policy from YAML or JSON text (JSON is YAML); never evaluates anything in it."""
    return _validated(PolicySpec, _document(text))


def parse_record(text: str | bytes) -> PolicySpec | PolicyDeletion:
    """A record of the policies topic: a policy, or a deletion (a mapping with ``deletes``)."""
    document = _document(text)
    return _validated(PolicyDeletion if "deletes" in document else PolicySpec, document)


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


def compile_policy(spec: PolicySpec, limits: ConditionLimits | None = None) -> CompiledPolicy:
    """Checks every condition against ``limits``, the feature catalogue and the policy
    function set, then compiles it; ``PolicyRejected`` whatever goes wrong."""
    catalogue = WORKER_FEATURES.keys() | FLEET_FEATURES.keys()
    shadowed = sorted(spec.params.keys() & catalogue)
    if shadowed:
        raise PolicyRejected(f"parameters shadow features: {', '.join(shadowed)}")
    limits = limits or PolicyLimits().condition
    conditions = [spec.condition, spec.exit_condition,
                  *(stage.condition for stage in spec.effective_stages())]
    try:
        for condition in conditions:
            if condition:
                check_condition(condition, limits, catalogue | spec.params.keys())
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
    except Exception as exc:  # a compiler's own failure refuses the policy, not the service
        raise PolicyRejected(f"does not compile: {type(exc).__name__}: {exc}") from None


def _audit_name(name: str) -> str:
    return _NOT_IDENTIFIER.sub("_", name)[:128] or "unnamed"


class PolicyRegistry:
    """Name → the running version, plus every version seen (for ``dsec policy list``)."""

    def __init__(self, verifier: Verifier, limits: PolicyLimits | None = None) -> None:
        self._verifier = verifier
        self.limits = limits or PolicyLimits()
        self._active: dict[str, CompiledPolicy] = {}
        self._versions: dict[str, dict[int, PolicySpec]] = {}
        self._deleted_up_to: dict[str, int] = {}
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
            return self._install(spec, verified=False)
        except Exception as exc:  # no policy can stop the registry
            return self._rejected(spec.name, spec.version, f"{type(exc).__name__}: {exc}")

    def install_trusted(self, spec: PolicySpec) -> PolicyDecision | None:
        """Run ``spec`` with no signature checked: the built-in pack, which is part of the
        installed code, or an offline replay's policies, trusted as given."""
        try:
            return self._install(spec, verified=True)
        except Exception as exc:
            return self._rejected(spec.name, spec.version, f"{type(exc).__name__}: {exc}")

    def _install(self, spec: PolicySpec, verified: bool) -> PolicyDecision | None:
        if not verified:
            try:
                signed = self._verifier.verify(spec)
            except SignatureError as exc:
                return self._rejected(spec.name, spec.version, f"signature: {exc}")
            outside = self._outside_pools(signed, spec.name, spec)
            if outside is not None:
                return self._rejected(spec.name, spec.version, outside)
        deleted = self._deleted_up_to.get(spec.name)
        if deleted is not None and spec.version <= deleted:
            return self._rejected(spec.name, spec.version,
                                  f"deleted up to v{deleted}; publish a later version")
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
            compiled = compile_policy(spec, self.limits.condition)
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
        """One record of the policies topic: a policy, or a signed deletion of one."""
        name = (key or b"").decode("utf-8", "replace")
        try:
            return self._offer(name, value)
        except Exception as exc:  # no record can stop the registry
            return self._rejected(name, 0, f"{type(exc).__name__}: {exc}")

    def _offer(self, name: str, value: bytes | None) -> PolicyDecision | None:
        if value is None:
            running = self._active.get(name)
            return self._rejected(
                name, running.spec.version if running else 0,
                "unsigned tombstone: deletes nothing (dsec policy delete writes a signed "
                "deletion)",
            )
        try:
            record = parse_record(value)
        except PolicyRejected as exc:
            return self._rejected(name, 0, exc.reason)
        if isinstance(record, PolicyDeletion):
            if record.deletes != name:
                return self._rejected(name, record.up_to_version,
                                      f"keyed {name!r} but deletes {record.deletes!r}")
            return self.delete(record)
        if record.name != name:
            return self._rejected(name, record.version,
                                  f"keyed {name!r} but named {record.name!r}")
        return self.install(record)

    def delete(self, deletion: PolicyDeletion) -> PolicyDecision | None:
        """Verify ``deletion`` and stop the policy it names, if the version running is one it
        covers; ``None`` when there is nothing it covers to stop."""
        name, up_to = deletion.deletes, deletion.up_to_version
        try:
            signed = self._verifier.verify(deletion)
        except SignatureError as exc:
            return self._rejected(name, up_to, f"deletion signature: {exc}")
        outside = self._outside_pools(signed, name, None)
        if outside is not None:
            return self._rejected(name, up_to, f"deletion: {outside}")
        self._deleted_up_to[name] = max(self._deleted_up_to.get(name, 0), up_to)
        running = self._active.get(name)
        if running is None or running.spec.version > up_to:
            return None
        del self._active[name]
        self.generation += 1
        return PolicyDecision(
            policy_name=_audit_name(name), policy_version=running.spec.version,
            decision=DecisionKind.POLICY_DELETED,
            detail=f"signed deletion up to v{up_to} on the policies topic",
        )

    def _outside_pools(self, signed: SignedBy, name: str, spec: PolicySpec | None) -> str | None:
        """Why a pool-publisher's signature does not cover ``spec`` (a new version) and the
        version of ``name`` running now; None for any other key."""
        if signed.role is not KeyRole.POOL_PUBLISHER:
            return None
        running = self._active.get(name)
        if spec is None and running is None:
            return f"no policy {name} of pools {sorted(signed.pools)} is running"
        for what, policy in (("it", spec), ("the version running", running and running.spec)):
            if policy is None:
                continue
            pools = set(policy.selector.pools)
            if not pools or not pools <= signed.pools:
                return (f"pool-publisher key {signed.key_id} is for pools "
                        f"{sorted(signed.pools)}; {what} selects "
                        f"{sorted(pools) if pools else 'every pool'}")
        return None

    @staticmethod
    def _rejected(name: str, version: int, reason: str) -> PolicyDecision:
        return PolicyDecision(
            policy_name=_audit_name(name), policy_version=max(version, 0),
            decision=DecisionKind.POLICY_REJECTED, detail=reason[:2048],
        )
