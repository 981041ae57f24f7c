"""A meta-policy's action: move one parameter of another policy, within the floor and
ceiling declared with that parameter.

Fleet features of a pool (``FeatureEvent.target_pool``) tune that pool alone: the pool's
next version, signed, carries the new value as an override. Features of no pool tune the
fleet: the policy's next version. Either is published (pools or policies topic), audited,
and undone by ``dsec policy revert``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dsec.policy_engine.pool_registry import PoolRegistry
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import FeatureEvent, PolicySpec, Signer
from dsec.schemas.policies import DecisionKind, PolicyTune
from dsec.schemas.pools import PoolSpec

__all__ = ["Tuner", "clamp", "tuned"]

Audit = Callable[..., None]


class _Output(Protocol):
    decisions: list
    policies: list[PolicySpec]
    pools: list[PoolSpec]


def clamp(spec: PolicySpec, tune: PolicyTune, value: float) -> float:
    """``value`` within the meta-policy's range and the floor and ceiling ``spec`` declares
    for the parameter (the tighter of the two)."""
    low, high = tune.min_value, tune.max_value
    bounds = spec.bounds.get(tune.param)
    if bounds is not None:
        low, high = max(low, bounds.min_value), min(high, bounds.max_value)
        if low > high:  # disjoint ranges: the parameter's own bounds win
            low, high = bounds.min_value, bounds.max_value
    return min(max(value, low), high)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def tuned(spec: PolicySpec, meta: PolicySpec, version: int | None = None) -> PolicySpec | None:
    """The next version of ``spec`` (``version``, else the one after it) with the
    meta-policy's parameter moved, or ``None`` when it is already at its bound."""
    tune = meta.tune
    assert tune is not None
    current = spec.params.get(tune.param)
    if current is None:
        return None
    value = clamp(spec, tune, current + tune.delta)
    if value == current:
        return None
    body = spec.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    body["version"] = version or spec.version + 1
    body["params"] = {**spec.params, tune.param: value}
    return PolicySpec.model_validate(body)


class Tuner:
    def __init__(self, registry: PolicyRegistry, pools: PoolRegistry, signer: Signer) -> None:
        self.registry = registry
        self.pools = pools
        self._signer = signer

    def tune(self, meta: PolicySpec, event: FeatureEvent, kind: DecisionKind, audit: Audit,
             detail: str, out: _Output) -> None:
        tune = meta.tune
        assert tune is not None
        pool = event.target_pool()
        target = self.registry.get(tune.policy, pool)
        if target is None:
            audit(DecisionKind.EVALUATION_ERROR, 0, f"no policy {tune.policy!r} to tune")
            return
        if tune.param not in target.bounds:
            audit(DecisionKind.EVALUATION_ERROR, 0,
                  f"{tune.policy} v{target.version} declares no floor and ceiling for "
                  f"{tune.param} (bounds): not tuned")
            return
        if pool is None:
            self._tune_fleet(meta, target, kind, audit, detail, out)
        else:
            self._tune_pool(meta, target, pool, kind, audit, detail, out)

    def _tune_fleet(self, meta: PolicySpec, target: PolicySpec, kind: DecisionKind,
                    audit: Audit, detail: str, out: _Output) -> None:
        tune = meta.tune
        assert tune is not None
        successor = tuned(target, meta, self.registry.latest_version(target.name) + 1)
        if successor is None:
            audit(kind, 0, f"{tune.policy}.{tune.param} already at its bound; {detail}")
            return
        change = (f"{tune.policy} v{successor.version}: {tune.param} "
                  f"{_number(target.params[tune.param])} -> "
                  f"{_number(successor.params[tune.param])}")
        if kind is DecisionKind.DRY_RUN:
            audit(kind, 0, f"would publish {change}; {detail}")
            return
        out.policies.append(self._signer.sign(successor))
        audit(kind, 0, f"published {change}; {detail}")

    def _tune_pool(self, meta: PolicySpec, target: PolicySpec, pool: str, kind: DecisionKind,
                   audit: Audit, detail: str, out: _Output) -> None:
        tune = meta.tune
        assert tune is not None
        current = self.pools.effective(target, pool).spec.params[tune.param]
        value = clamp(target, tune, current + tune.delta)
        name = f"{tune.policy}.{tune.param}"
        if value == current:
            audit(kind, 0, f"pool {pool}: {name} already at its bound ({_number(value)}); "
                           f"{detail}")
            return
        change = f"{name} {_number(current)} -> {_number(value)}"
        base = self.pools.get(pool) or PoolSpec(name=pool)
        try:
            successor = base.with_override(
                tune.policy, tune.param, value, self.pools.next_version(pool),
                f"{meta.name} v{meta.version} ({detail}): {change}")
        except ValueError as exc:
            audit(DecisionKind.EVALUATION_ERROR, 0, f"pool {pool}: {change} refused: {exc}")
            return
        change = f"pool {pool} v{successor.version}: {change}"
        if kind is DecisionKind.DRY_RUN:
            audit(kind, 0, f"would publish {change}; {detail}")
            return
        signed = self._signer.sign(successor)
        out.pools.append(signed)
        # Known here at once, so that the next tuning builds on it before it is read back.
        accepted = self.pools.install(signed)
        if accepted is not None:
            out.decisions.append(accepted)
        audit(kind, 0, f"published {change}; {detail}")
