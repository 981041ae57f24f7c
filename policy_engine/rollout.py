"""What runs where, and every version seen: the built-in pack and the policies and pools
topics read whole, as the engine reads them, for ``dsec policy status|history|promote|
rollback|revert`` and ``dsec pool list``.

Pure: records in; the records to publish (unsigned) out. Nothing is ever rewritten: a
promotion, a rollback or a revert is a new signed record, so it is audited where the
engine installs it and can itself be undone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dsec.policy_engine.limits import PolicyLimits
from dsec.policy_engine.policy_log import PolicyRecord
from dsec.policy_engine.pool_registry import PoolRegistry, parse_pool_record
from dsec.policy_engine.registry import PolicyRegistry, PolicyRejected, parse_record
from dsec.schemas import PolicyDeletion, PolicySpec, PoolSpec, Verifier
from dsec.schemas.policies import DecisionKind

__all__ = ["HistoryEntry", "RolloutError", "Rollouts", "Running"]


class RolloutError(ValueError):
    """What was asked cannot be done as things stand; the message says why."""


@dataclass(frozen=True)
class HistoryEntry:
    """One change of a policy: a version of it (``scope`` "fleet" or "canary <pool>") or a
    pool's version that changed its overrides of it (``scope`` "pool <pool>", ``version``
    the pool's). ``params``: the policy's parameters in that scope after the change (for a
    pool, its overrides)."""

    scope: str
    version: int
    params: dict[str, float]
    note: str = ""


@dataclass(frozen=True)
class Running:
    """What runs in one place: ``where`` "fleet" or "pool <name>"."""

    where: str
    version: int
    dry_run: bool
    how: str
    overrides: dict[str, float] = field(default_factory=dict)


def _changed(before: dict[str, float], after: dict[str, float]) -> str:
    names = sorted(before.keys() | after.keys())
    return ", ".join(f"{n} {before.get(n, '-')} -> {after.get(n, '-')}" for n in names
                     if before.get(n) != after.get(n))


class Rollouts:
    def __init__(self, verifier: Verifier, builtin: Iterable[PolicySpec],
                 policy_records: Iterable[PolicyRecord], pool_records: Iterable[PolicyRecord],
                 limits: PolicyLimits | None = None) -> None:
        """``builtin``: the pack as the engine loads it; the topics' records are verified
        with ``verifier``, as the engine verifies them."""
        self.registry = PolicyRegistry(verifier, limits)
        self.pools = PoolRegistry(verifier)
        self.builtin: set[tuple[str, int]] = set()
        self.rejected: dict[str, str] = {}
        self._history: dict[str, list[HistoryEntry]] = {}
        self._pool_versions: dict[str, list[PoolSpec]] = {}
        for spec in builtin:
            if self._policy(spec, self.registry.install_trusted(spec), "built-in"):
                self.builtin.add((spec.name, spec.version))
        for record in policy_records:
            self._policy_record(record)
        for record in pool_records:
            self._pool_record(record)

    def _policy(self, spec: PolicySpec, decision, note: str) -> bool:
        if decision is None or decision.decision is not DecisionKind.POLICY_ACCEPTED:
            return False
        scope = f"canary {spec.pool}" if spec.pool else "fleet"
        if spec.dry_run:
            scope += " (dry run)"
        self._history.setdefault(spec.name, []).append(
            HistoryEntry(scope, spec.version, dict(spec.params), note or decision.detail))
        return True

    def _policy_record(self, record: PolicyRecord) -> None:
        decision = self.registry.offer(record.key, record.value)
        if decision is None:
            return
        if decision.decision is DecisionKind.POLICY_REJECTED:
            self.rejected[decision.policy_name] = decision.detail
            return
        parsed = parse_record(record.value or b"")
        if isinstance(parsed, PolicyDeletion):
            scope = f"canary {parsed.pool}" if parsed.pool else "fleet"
            self._history.setdefault(parsed.deletes, []).append(HistoryEntry(
                scope, decision.policy_version, {}, decision.detail))
            return
        self._policy(parsed, decision, "")

    def _pool_record(self, record: PolicyRecord) -> None:
        decision = self.pools.offer(record.key, record.value)
        if decision is None:
            return
        if decision.decision is DecisionKind.POOL_REJECTED:
            self.rejected[decision.policy_name] = decision.detail
            return
        try:
            parsed = parse_pool_record(record.value or b"")
        except PolicyRejected:
            return
        if isinstance(parsed, PoolSpec):
            self._pool_versions.setdefault(parsed.name, []).append(parsed)
        else:
            self._pool_versions.pop(parsed.deletes, None)

    # --- what runs where ----------------------------------------------------------------

    def spec(self, name: str) -> PolicySpec:
        spec = self.registry.get(name)
        if spec is None and not self.registry.canaries(name):
            raise RolloutError(f"no policy {name} on the topic or in the built-in pack")
        return spec  # type: ignore[return-value]

    def status(self, name: str) -> list[Running]:
        fleet = self.spec(name)
        rows = []
        if fleet is not None:
            how = "built-in" if (name, fleet.version) in self.builtin else "topic"
            rows.append(Running("fleet", fleet.version, fleet.dry_run, how, dict(fleet.params)))
        canaries = self.registry.canaries(name)
        for pool in sorted(canaries.keys() | {p.name for p in self.pools.all()}):
            canary = canaries.get(pool)
            running = canary.spec if canary is not None else fleet
            declared = self.pools.get(pool)
            overrides = declared.overrides(name) if declared is not None else {}
            if canary is None and not overrides and not (declared and declared.dry_run):
                continue  # runs the fleet's version as it is
            hows = []
            if canary is not None:
                beside = f" beside v{fleet.version}" if fleet is not None else ""
                hows.append(f"canary{' in dry run' + beside if canary.spec.dry_run else ''}")
            if declared is not None and (overrides or declared.dry_run):
                hows.append(f"pool {pool} v{declared.version} "
                            f"{'in dry run' if declared.dry_run else 'overrides'}")
            dry = running.dry_run or bool(declared and declared.dry_run)
            rows.append(Running(f"pool {pool}", running.version, dry, ", ".join(hows),
                                overrides))
        return rows

    def history(self, name: str) -> list[HistoryEntry]:
        """Every version of ``name`` seen, then every pool version that changed its
        overrides, each in the order published."""
        self.spec(name)
        entries = list(self._history.get(name, []))
        for pool, versions in sorted(self._pool_versions.items()):
            before: dict[str, float] = {}
            for version in versions:
                after = version.overrides(name)
                if after != before:
                    note = version.reason or "published"
                    entries.append(HistoryEntry(f"pool {pool}", version.version, after,
                                                f"{note} ({_changed(before, after)})"))
                before = after
        return entries

    # --- what to publish ----------------------------------------------------------------

    def next_version(self, name: str) -> int:
        return self.registry.latest_version(name) + 1

    def _canary(self, name: str, pool: str | None) -> tuple[str, PolicySpec]:
        canaries = self.registry.canaries(name)
        if pool is not None:
            if pool not in canaries:
                raise RolloutError(f"{name} has no canary running in pool {pool}")
            return pool, canaries[pool].spec
        if len(canaries) != 1:
            where = ", ".join(sorted(canaries)) or "no pool"
            raise RolloutError(f"{name} has canaries in {where}: name the pool (--pool)")
        (pool, compiled), = canaries.items()
        return pool, compiled.spec

    def promote(self, name: str, pool: str | None = None) -> list[PolicySpec | PolicyDeletion]:
        """The canary's version as the fleet's (same number, out of dry run), then the
        canary's removal."""
        pool, canary = self._canary(name, pool)
        body = canary.model_dump(mode="json", exclude={"signature", "pool"}, exclude_none=True)
        fleet = PolicySpec.model_validate({**body, "dry_run": False})
        return [fleet, PolicyDeletion(deletes=name, pool=pool, up_to_version=canary.version)]

    def rollback(self, name: str, pool: str | None = None) -> list[PolicyDeletion]:
        """Deletions of the canary in ``pool`` (of every canary of ``name`` when None)."""
        canaries = self.registry.canaries(name)
        if pool is not None:
            self._canary(name, pool)
            canaries = {pool: canaries[pool]}
        if not canaries:
            raise RolloutError(f"{name} has no canary running")
        return [PolicyDeletion(deletes=name, pool=where, up_to_version=c.spec.version)
                for where, c in sorted(canaries.items())]

    def revert(self, name: str, to: int | None = None) -> PolicySpec:
        """Version ``to`` of ``name`` (default: the fleet's version before the one running)
        published again as the next version, in its own scope."""
        self.spec(name)
        # one spec per version: a promoted canary's fleet version is the same body
        specs = self.registry.version_specs(name)
        if to is None:
            fleet = sorted(v for v, spec in specs.items() if spec.pool is None)
            if len(fleet) < 2:
                raise RolloutError(f"{name} has no earlier fleet version to revert to")
            to = fleet[-2]
        if to not in specs:
            raise RolloutError(f"no version {to} of {name}; see dsec policy history {name}")
        body = specs[to].model_dump(mode="json", exclude={"signature"}, exclude_none=True)
        return PolicySpec.model_validate({**body, "version": self.next_version(name)})

    def revert_pool(self, name: str, pool: str, to: int | None = None) -> PoolSpec:
        """Pool ``pool``'s overrides of ``name`` as they were in its version ``to``
        (default: before the latest change to them), as the pool's next version; its
        overrides of other policies stay as they are now."""
        self.spec(name)
        current = self.pools.get(pool)
        versions = self._pool_versions.get(pool, [])
        if current is None or not versions:
            raise RolloutError(f"no pool {pool} on the pools topic")
        if to is None:
            changes = [i for i, v in enumerate(versions)
                       if v.overrides(name) != (versions[i - 1].overrides(name) if i else {})]
            if not changes:
                raise RolloutError(f"pool {pool} never changed the parameters of {name}")
            before = versions[changes[-1] - 1].overrides(name) if changes[-1] else {}
            to = versions[changes[-1] - 1].version if changes[-1] else 0
        else:
            found = [v for v in versions if v.version == to]
            if not found:
                raise RolloutError(f"no version {to} of pool {pool}")
            before = found[0].overrides(name)
        return current.with_overrides(
            name, before, self.pools.next_version(pool),
            f"revert of {name} to pool {pool} v{to}: "
            f"{_changed(current.overrides(name), before) or 'no change'}")
