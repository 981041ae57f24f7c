"""The resource pools the engine knows, from the compacted pools topic (checked, signature
verified, versioned), and what a policy becomes for a pool's workers: its parameters with
the pool's overrides on top, in dry run where the pool is.

A pool record that does not parse, is unsigned or tampered with is rejected with a reason
fit for the audit log; the pools already known carry on. Only a signed deletion deletes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from dsec.policy_engine.registry import PolicyRejected, audit_name, load_document, validated
from dsec.schemas import PolicyDecision, PolicySpec, SignatureError, SignedBy, Verifier
from dsec.schemas.codec import describe
from dsec.schemas.policies import DecisionKind
from dsec.schemas.pools import PoolDeletion, PoolSpec

__all__ = ["Effective", "PoolRegistry", "parse_pool", "parse_pool_record", "pool_audit_name"]

_CACHE_LIMIT = 4096


def pool_audit_name(name: str) -> str:
    """Pools are audited among the policies' decisions under ``pool:<name>``."""
    return audit_name(f"pool:{name}")


def parse_pool(text: str | bytes) -> PoolSpec:
    """A pool from YAML or JSON text."""
    return validated(PoolSpec, load_document(text, "pool"))


def parse_pool_record(text: str | bytes) -> PoolSpec | PoolDeletion:
    """A record of the pools topic: a pool, or a deletion (a mapping with ``deletes``)."""
    document = load_document(text, "pool")
    return validated(PoolDeletion if "deletes" in document else PoolSpec, document)


@dataclass(frozen=True)
class Effective:
    """A policy as it runs for one pool's workers. ``note``: the pool version whose
    overrides it carries (for command reasons); ``problem``: why the pool's overrides were
    left out (they do not fit this version of the policy), else None."""

    spec: PolicySpec
    note: str = ""
    problem: str | None = None


def _within_pools(signed: SignedBy, pool: str) -> None:
    """A pool-publisher key confined to some pools signs for those alone."""
    if signed.pools and pool not in signed.pools:
        raise SignatureError(f"key {signed.key_id} publishes pools {sorted(signed.pools)} "
                             f"only, not {pool}")


class PoolRegistry:
    def __init__(self, verifier: Verifier) -> None:
        self._verifier = verifier
        self._pools: dict[str, PoolSpec] = {}
        self._deleted_up_to: dict[str, int] = {}
        self._effective: dict[tuple, Effective] = {}
        # every version installed: the engine installs its own tuned versions at once and
        # reads them back from the topic later, behind newer ones
        self._installed: set[tuple[str, int, str | None]] = set()
        self.generation = 0

    def get(self, name: str) -> PoolSpec | None:
        return self._pools.get(name)

    def all(self) -> list[PoolSpec]:
        return [self._pools[name] for name in sorted(self._pools)]

    def next_version(self, name: str) -> int:
        current = self._pools.get(name)
        return max(current.version if current else 0, self._deleted_up_to.get(name, 0)) + 1

    def effective(self, spec: PolicySpec, pool: str | None) -> Effective:
        declared = self._pools.get(pool) if pool is not None else None
        if declared is None:
            return Effective(spec)
        key = (spec.name, spec.version, spec.pool, spec.dry_run, id(spec), declared.name,
               declared.version)
        found = self._effective.get(key)
        if found is None:
            if len(self._effective) >= _CACHE_LIMIT:
                self._effective.clear()
            found = self._effective[key] = _apply(spec, declared)
        return found

    def install(self, pool: PoolSpec) -> PolicyDecision | None:
        """Verify and keep ``pool``; ``None`` when it is a version installed before."""
        if (pool.name, pool.version, pool.signature) in self._installed:
            return None
        try:
            _within_pools(self._verifier.verify(pool), pool.name)
        except SignatureError as exc:
            return _rejected(pool.name, pool.version, f"signature: {exc}")
        deleted = self._deleted_up_to.get(pool.name)
        if deleted is not None and pool.version <= deleted:
            return _rejected(pool.name, pool.version,
                             f"deleted up to v{deleted}; publish a later version")
        current = self._pools.get(pool.name)
        if current is not None and pool.version <= current.version:
            return _rejected(pool.name, pool.version,
                             f"version {pool.version} is not newer than {current.version}")
        self._pools[pool.name] = pool
        self._installed.add((pool.name, pool.version, pool.signature))
        self.generation += 1
        why = f": {pool.reason}" if pool.reason else ""
        return PolicyDecision(
            policy_name=pool_audit_name(pool.name), policy_version=pool.version,
            decision=DecisionKind.POOL_ACCEPTED,
            detail=f"pool {pool.name} v{pool.version}"
                   f"{' in dry-run' if pool.dry_run else ''}{why}"[:2048],
        )

    def delete(self, deletion: PoolDeletion) -> PolicyDecision | None:
        name, up_to = deletion.deletes, deletion.up_to_version
        try:
            _within_pools(self._verifier.verify(deletion), name)
        except SignatureError as exc:
            return _rejected(name, up_to, f"deletion signature: {exc}")
        self._deleted_up_to[name] = max(self._deleted_up_to.get(name, 0), up_to)
        current = self._pools.get(name)
        if current is None or current.version > up_to:
            return None
        del self._pools[name]
        self.generation += 1
        return PolicyDecision(
            policy_name=pool_audit_name(name), policy_version=current.version,
            decision=DecisionKind.POOL_DELETED,
            detail=f"signed deletion up to v{up_to}: its workers run the policies' own "
                   "parameters",
        )

    def offer(self, key: bytes | None, value: bytes | None) -> PolicyDecision | None:
        """One record of the pools topic: a pool, or a signed deletion of one."""
        name = (key or b"").decode("utf-8", "replace")
        try:
            return self._offer(name, value)
        except Exception as exc:  # no record can stop the registry
            return _rejected(name, 0, f"{type(exc).__name__}: {exc}")

    def _offer(self, name: str, value: bytes | None) -> PolicyDecision | None:
        if value is None:
            return _rejected(name, 0, "unsigned tombstone: deletes nothing (dsec pool delete "
                                      "writes a signed deletion)")
        try:
            record = parse_pool_record(value)
        except PolicyRejected as exc:
            return _rejected(name, 0, exc.reason)
        named = record.deletes if isinstance(record, PoolDeletion) else record.name
        if named != name:
            version = (record.up_to_version if isinstance(record, PoolDeletion)
                       else record.version)
            return _rejected(name, version, f"keyed {name!r} but names {named!r}")
        if isinstance(record, PoolDeletion):
            return self.delete(record)
        return self.install(record)


def _apply(spec: PolicySpec, pool: PoolSpec) -> Effective:
    overrides = pool.overrides(spec.name)
    if not overrides and not pool.dry_run:
        return Effective(spec)
    note = f"pool {pool.name} v{pool.version}"
    unknown = sorted(overrides.keys() - spec.params.keys())
    if unknown:
        return Effective(spec, problem=f"{note} sets parameters {spec.name} v{spec.version} "
                                       f"has not: {', '.join(unknown)}")
    body = spec.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    body["params"] = {**spec.params, **overrides}
    body["dry_run"] = spec.dry_run or pool.dry_run
    try:
        return Effective(PolicySpec.model_validate(body), note=note)
    except ValidationError as exc:
        return Effective(spec, problem=f"{note} does not fit {spec.name} v{spec.version}: "
                                       f"{describe(exc, limit=2)}")


def _rejected(name: str, version: int, reason: str) -> PolicyDecision:
    return PolicyDecision(
        policy_name=pool_audit_name(name), policy_version=max(version, 0),
        decision=DecisionKind.POOL_REJECTED, detail=reason[:2048],
    )
