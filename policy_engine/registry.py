"""The policies the engine runs: checked, signature-verified, compiled, versioned.

Policies arrive from the built-in pack (part of the installed code, so trusted as it is)
and from the compacted policies topic. A policy from the topic that does not parse, is
unsigned, tampered with or signed by a key not trusted to publish it, or whose conditions
are out of bounds or do not compile is rejected with a reason fit for the audit log,
whatever the failure; the ones already running carry on. Only a signed deletion record
deletes a policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from dsec.policy_engine.condition_check import ConditionLimits, check_condition
from dsec.policy_engine.conditions import ConditionError
from dsec.policy_engine.limits import PolicyLimits
from dsec.policy_engine.vectorised import VectorCondition
from dsec.schemas import PolicyDecision, PolicyDeletion, PolicySpec, SignatureError, Verifier
from dsec.schemas.codec import describe
from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES
from dsec.schemas.policies import DecisionKind, policy_key

MAX_POLICY_BYTES = 64 * 1024
# libyaml's parser, where PyYAML was built with it: it refuses nesting past a depth in
# microseconds, where the pure-Python scanner takes seconds over an unclosed "{{{...".
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_.:\-/]")


class PolicyRejected(ValueError):
    """A policy the engine will not run; ``reason`` goes to the audit log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def load_document(text: str | bytes, what: str = "policy") -> dict:
    """The mapping in YAML or JSON ``text``; ``PolicyRejected`` when it is none."""
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyRejected(f"{what} larger than {MAX_POLICY_BYTES} bytes")
    try:
        document = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise PolicyRejected(f"not YAML or JSON: {exc}") from None
    except Exception as exc:  # e.g. nesting too deep for the composer
        raise PolicyRejected(f"not YAML or JSON: {type(exc).__name__}") from None
    if not isinstance(document, dict):
        raise PolicyRejected(f"a {what} is a mapping")
    return document


_WHAT = {"PolicySpec": "policy", "PolicyDeletion": "policy deletion", "PoolSpec": "pool",
         "PoolDeletion": "pool deletion"}
M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], document: dict) -> M:
    """``document`` as a ``model``; ``PolicyRejected`` with the fields at fault."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        what = _WHAT.get(model.__name__, model.__name__)
        raise PolicyRejected(f"invalid {what}: {describe(exc)}") from None


def parse_policy(text: str | bytes) -> PolicySpec:
    """A policy from YAML or JSON text (JSON is YAML); never evaluates anything in it."""
    return validated(PolicySpec, load_document(text))


def parse_record(text: str | bytes) -> PolicySpec | PolicyDeletion:
    """A record of the policies topic: a policy, or a deletion (a mapping with ``deletes``)."""
    document = load_document(text)
    return validated(PolicyDeletion if "deletes" in document else PolicySpec, document)


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


def audit_name(name: str) -> str:
    return _NOT_IDENTIFIER.sub("_", name)[:128] or "unnamed"


def _row_by_row(compiled: CompiledPolicy) -> str:
    uncovered = [c.not_covered for c in (compiled.enter, compiled.exit) if c and c.not_covered]
    return f" (row by row in cel-python: {uncovered[0]})" if uncovered else ""


@dataclass(frozen=True)
class Rollout:
    """One policy as it runs: the fleet's version (None: a policy published to canary
    pools only) and, per pool, the newer version that runs there instead (``canaries``) or,
    in dry run, beside it (``shadows``)."""

    name: str
    fleet: CompiledPolicy | None
    canaries: Mapping[str, CompiledPolicy] = field(default_factory=dict)
    shadows: Mapping[str, CompiledPolicy] = field(default_factory=dict)

    def for_pool(self, pool: str | None) -> CompiledPolicy | None:
        canary = self.canaries.get(pool) if pool is not None else None
        return canary if canary is not None else self.fleet


class PolicyRegistry:
    """Name → the running version, its canaries by pool, plus every version seen (for
    ``dsec policy list``)."""

    def __init__(self, verifier: Verifier, limits: PolicyLimits | None = None) -> None:
        self.verifier = verifier
        self.limits = limits or PolicyLimits()
        self._active: dict[str, CompiledPolicy] = {}
        self._canaries: dict[str, dict[str, CompiledPolicy]] = {}
        self._versions: dict[str, dict[int, PolicySpec]] = {}
        self._deleted_up_to: dict[str, int] = {}
        self._canary_deleted_up_to: dict[tuple[str, str], int] = {}
        self._rollouts: tuple[int, list[Rollout]] = (-1, [])
        self.generation = 0

    def active(self) -> list[CompiledPolicy]:
        """Highest priority first: it claims a contested knob before the others look."""
        return sorted(self._active.values(), key=lambda c: (-c.spec.priority, c.spec.name))

    def canaries(self, name: str) -> dict[str, CompiledPolicy]:
        """The canaries of ``name`` that run, by pool: those newer than the fleet's version
        (one as new or older was promoted, or overtaken)."""
        fleet = self._active.get(name)
        floor = fleet.spec.version if fleet is not None else -1
        return {pool: compiled for pool, compiled in self._canaries.get(name, {}).items()
                if compiled.spec.version > floor}

    def rollouts(self) -> list[Rollout]:
        """Every policy that runs anywhere, with its canaries; made once per generation."""
        generation, rollouts = self._rollouts
        if generation == self.generation:
            return rollouts
        rollouts = []
        for name in sorted(self._active.keys() | self._canaries.keys()):
            canaries = self.canaries(name)
            fleet = self._active.get(name)
            if fleet is None and not canaries:
                continue
            rollouts.append(Rollout(
                name, fleet,
                canaries={p: c for p, c in canaries.items() if not c.spec.dry_run},
                shadows={p: c for p, c in canaries.items() if c.spec.dry_run}))
        self._rollouts = (self.generation, rollouts)
        return rollouts

    def get(self, name: str, pool: str | None = None) -> PolicySpec | None:
        """The version of ``name`` that acts for the workers of ``pool``."""
        if pool is not None:
            canary = self.canaries(name).get(pool)
            if canary is not None and not canary.spec.dry_run:
                return canary.spec
        compiled = self._active.get(name)
        return compiled.spec if compiled else None

    def versions(self, name: str) -> list[int]:
        return sorted(self._versions.get(name, {}))

    def version_specs(self, name: str) -> dict[int, PolicySpec]:
        """Every version of ``name`` installed, fleet or canary (a fleet version replaces
        the promoted canary of its number, the same body)."""
        return dict(sorted(self._versions.get(name, {}).items()))

    def latest_version(self, name: str) -> int:
        """The highest version of ``name`` seen or deleted, fleet or canary: a new one
        (tuned, promoted, reverted) is numbered after it."""
        deleted = [v for (n, _), v in self._canary_deleted_up_to.items() if n == name]
        return max([*self._versions.get(name, {}), self._deleted_up_to.get(name, 0), *deleted],
                   default=0)

    def install(self, spec: PolicySpec) -> PolicyDecision | None:
        """Verify and run ``spec``; ``None`` when it is the version already running."""
        try:
            return self._install(spec, verified=False)
        except Exception as exc:  # no policy can stop the registry
            return self._rejected(spec.name, spec.version, f"{type(exc).__name__}: {exc}")

    def install_trusted(self, spec: PolicySpec) -> PolicyDecision | None:
        """Run ``spec`` with no signature checked: the built-in pack, which is part of the
        installed code, trusted as it is."""
        try:
            return self._install(spec, verified=True)
        except Exception as exc:
            return self._rejected(spec.name, spec.version, f"{type(exc).__name__}: {exc}")

    def _install(self, spec: PolicySpec, verified: bool) -> PolicyDecision | None:
        if not verified:
            try:
                self.verifier.verify(spec)
            except SignatureError as exc:
                return self._rejected(spec.name, spec.version, f"signature: {exc}")
        deleted = self._deleted_up_to.get(spec.name)
        if spec.pool is not None:
            deleted = max(deleted or 0, self._canary_deleted_up_to.get(
                (spec.name, spec.pool), 0)) or None
        if deleted is not None and spec.version <= deleted:
            return self._rejected(spec.name, spec.version,
                                  f"deleted up to v{deleted}; publish a later version")
        if spec.pool is not None:
            return self._install_canary(spec, spec.pool)
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
        promoted = sorted(pool for pool, canary in self._canaries.get(spec.name, {}).items()
                          if canary.spec.version == spec.version)
        self._active[spec.name] = compiled
        self._versions.setdefault(spec.name, {})[spec.version] = spec
        self.generation += 1
        note = _row_by_row(compiled)
        if promoted:
            note += f", promoted from the canary in pool {', '.join(promoted)}"
        return PolicyDecision(
            policy_name=spec.name, policy_version=spec.version,
            decision=DecisionKind.POLICY_ACCEPTED,
            detail=f"running v{spec.version}{' in dry-run' if spec.dry_run else ''}{note}",
        )

    def _install_canary(self, spec: PolicySpec, pool: str) -> PolicyDecision | None:
        current = self._canaries.get(spec.name, {}).get(pool)
        if current is not None:
            if spec.version == current.spec.version and spec == current.spec:
                return None
            if spec.version <= current.spec.version:
                return self._rejected(
                    spec.name, spec.version, f"version {spec.version} is not newer than "
                    f"v{current.spec.version}, the canary in pool {pool}")
        fleet = self.get(spec.name)
        if fleet is not None and spec.version <= fleet.version:
            return self._rejected(spec.name, spec.version, f"canary v{spec.version} in pool "
                                  f"{pool} is not newer than v{fleet.version}, the fleet's")
        try:
            compiled = compile_policy(spec, self.limits.condition)
        except PolicyRejected as exc:
            return self._rejected(spec.name, spec.version, exc.reason)
        self._canaries.setdefault(spec.name, {})[pool] = compiled
        self._versions.setdefault(spec.name, {})[spec.version] = spec
        self.generation += 1
        instead = f"v{fleet.version}" if fleet is not None else "nothing"
        how = f"in dry-run beside {instead}" if spec.dry_run else f"in place of {instead}"
        return PolicyDecision(
            policy_name=spec.name, policy_version=spec.version,
            decision=DecisionKind.POLICY_ACCEPTED,
            detail=f"running v{spec.version} as a canary in pool {pool}, {how}"
                   f"{_row_by_row(compiled)}",
        )

    def offer(self, key: bytes | None, value: bytes | None) -> PolicyDecision | None:
        """One record of the policies topic: a policy, or a signed deletion of one."""
        name = (key or b"").decode("utf-8", "replace")
        try:
            return self._offer(name, value)
        except Exception as exc:  # no record can stop the registry
            return self._rejected(name, 0, f"{type(exc).__name__}: {exc}")

    def _offer(self, key: str, value: bytes | None) -> PolicyDecision | None:
        name = key.partition("@")[0]
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
            if policy_key(record.deletes, record.pool) != key:
                return self._rejected(name, record.up_to_version, f"keyed {key!r} but deletes "
                                      f"{policy_key(record.deletes, record.pool)!r}")
            return self.delete(record)
        if policy_key(record.name, record.pool) != key:
            return self._rejected(name, record.version, f"keyed {key!r} but named "
                                  f"{policy_key(record.name, record.pool)!r}")
        return self.install(record)

    def delete(self, deletion: PolicyDeletion) -> PolicyDecision | None:
        """Verify ``deletion`` and stop the policy it names, if the version running is one it
        covers; ``None`` when there is nothing it covers to stop."""
        name, up_to = deletion.deletes, deletion.up_to_version
        try:
            self.verifier.verify(deletion)
        except SignatureError as exc:
            return self._rejected(name, up_to, f"deletion signature: {exc}")
        if deletion.pool is not None:
            return self._roll_back(name, deletion.pool, up_to)
        self._deleted_up_to[name] = max(self._deleted_up_to.get(name, 0), up_to)
        canaries = self._canaries.get(name, {})
        for pool in [p for p, c in canaries.items() if c.spec.version <= up_to]:
            del canaries[pool]
            self.generation += 1
        running = self._active.get(name)
        if running is None or running.spec.version > up_to:
            return None
        del self._active[name]
        self.generation += 1
        return PolicyDecision(
            policy_name=audit_name(name), policy_version=running.spec.version,
            decision=DecisionKind.POLICY_DELETED,
            detail=f"signed deletion up to v{up_to} on the policies topic",
        )

    def _roll_back(self, name: str, pool: str, up_to: int) -> PolicyDecision | None:
        key = (name, pool)
        self._canary_deleted_up_to[key] = max(self._canary_deleted_up_to.get(key, 0), up_to)
        canary = self._canaries.get(name, {}).get(pool)
        if canary is None or canary.spec.version > up_to:
            return None
        del self._canaries[name][pool]
        self.generation += 1
        fleet = self.get(name)
        now = f"v{fleet.version}" if fleet is not None else "nothing"
        how = ("removed after its promotion" if fleet is not None
               and fleet.version >= canary.spec.version else "rolled back")
        return PolicyDecision(
            policy_name=audit_name(name), policy_version=canary.spec.version,
            decision=DecisionKind.POLICY_DELETED,
            detail=f"canary v{canary.spec.version} in pool {pool} {how}: pool {pool} "
                   f"runs {now}",
        )

    @staticmethod
    def _rejected(name: str, version: int, reason: str) -> PolicyDecision:
        return PolicyDecision(
            policy_name=audit_name(name), policy_version=max(version, 0),
            decision=DecisionKind.POLICY_REJECTED, detail=reason[:2048],
        )
