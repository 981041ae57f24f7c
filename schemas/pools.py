"""Resource pools as data: a named group of workers with its own quotas, labels and
parameter overrides of the policies, published signed on the compacted pools topic.

A worker says which pool it runs in (``WorkerIdentity.pool``); every policy evaluated for
a worker of pool P runs with P's overrides on top of its own parameters. A quota is the
parameter of a built-in policy that enforces it (``QUOTA_PARAMS``); ``params`` overrides
any other parameter of any policy. Meta-policies tune a pool by publishing its next
version, signed like any other, with the reason in ``reason``.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from dsec.schemas.actuations import GIB, MIB
from dsec.schemas.base import Event, Identifier, LabelKey, LabelValue, Model, Version

ParamName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
Reason = Annotated[str, Field(max_length=1024)]

# quota -> (the policy that enforces it, its parameter)
QUOTA_PARAMS: dict[str, tuple[str, str]] = {
    "base_memory_bytes": ("elastic-memory-quota", "base_quota_bytes"),
    "elastic_memory_bytes": ("elastic-memory-quota", "ceiling_bytes"),
    "bandwidth_cap_bytes_per_s": ("bandwidth-latency-breaker", "bandwidth_cap_bytes_per_s"),
    "latency_cap_ms": ("bandwidth-latency-breaker", "latency_cap_ms"),
}
_QUOTA_OF = {target: quota for quota, target in QUOTA_PARAMS.items()}
MemoryBytes = Annotated[int, Field(ge=256 * MIB, le=1024 * GIB)]


class PoolQuotas(Model):
    """None leaves the enforcing policy's own value: in the built-in pack a 7 GiB base and a
    12 GiB elastic memory quota, a 128 MiB/s bandwidth cap and an 85 ms latency cap."""

    base_memory_bytes: MemoryBytes | None = None
    elastic_memory_bytes: MemoryBytes | None = None
    bandwidth_cap_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    latency_cap_ms: Annotated[float, Field(gt=0, le=600_000, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _base_within_elastic(self) -> PoolQuotas:
        base, elastic = self.base_memory_bytes, self.elastic_memory_bytes
        if base is not None and elastic is not None and base > elastic:
            raise ValueError("base_memory_bytes must not exceed elastic_memory_bytes")
        return self


class PoolSpec(Model):
    name: Identifier
    version: Annotated[Version, Field(ge=1)] = 1
    description: Annotated[str, Field(max_length=4096)] = ""
    # What the pool is made of: GPU model, node group, job, ...; informative, and shown by
    # ``dsec pool list`` (selectors match the labels workers send).
    labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=16)] = Field(
        default_factory=dict)
    quotas: PoolQuotas = Field(default_factory=PoolQuotas)
    # policy name -> parameter -> value, for this pool's workers
    params: Annotated[
        dict[Identifier, Annotated[dict[ParamName, float], Field(max_length=32)]],
        Field(max_length=64),
    ] = Field(default_factory=dict)
    # Every policy's decisions on this pool's workers are audited, and nothing is commanded.
    dry_run: bool = False
    reason: Reason = ""
    signature: Annotated[str, Field(max_length=256)] | None = None

    @field_validator("params")
    @classmethod
    def _finite(cls, params: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        if not all(math.isfinite(v) for values in params.values() for v in values.values()):
            raise ValueError("parameters must be finite")
        return params

    @model_validator(mode="after")
    def _quota_given_once(self) -> PoolSpec:
        twice = sorted(f"{policy}.{param} (quotas.{_QUOTA_OF[(policy, param)]})"
                       for policy, values in self.params.items() for param in values
                       if (policy, param) in _QUOTA_OF)
        if twice:
            raise ValueError(f"give a quota in quotas, not in params: {', '.join(twice)}")
        return self

    def overrides(self, policy: str) -> dict[str, float]:
        """The parameters of ``policy`` this pool sets: its quotas and its ``params``."""
        values = dict(self.params.get(policy, {}))
        for quota, (owner, param) in QUOTA_PARAMS.items():
            value = getattr(self.quotas, quota)
            if owner == policy and value is not None:
                values[param] = float(value)
        return values

    def with_override(self, policy: str, param: str, value: float, version: int,
                      reason: str) -> PoolSpec:
        """Version ``version`` of this pool, unsigned, with ``policy``'s ``param`` set to
        ``value`` (in ``quotas`` where it is a quota)."""
        values = {**self.overrides(policy), param: value}
        return self.with_overrides(policy, values, version, reason)

    def with_overrides(self, policy: str, values: dict[str, float], version: int,
                       reason: str) -> PoolSpec:
        """Version ``version`` of this pool, unsigned, overriding exactly ``values`` of
        ``policy`` (quotas included); the other policies' overrides stay as they are."""
        body = self.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
        quotas = {quota: value for quota, value in body["quotas"].items()
                  if QUOTA_PARAMS[quota][0] != policy}
        params = {name: dict(given) for name, given in body["params"].items() if name != policy}
        for param, value in values.items():
            quota = _QUOTA_OF.get((policy, param))
            if quota is not None:
                quotas[quota] = int(value) if quota.endswith("_bytes") else value
            else:
                params.setdefault(policy, {})[param] = value
        return PoolSpec.model_validate({**body, "quotas": quotas, "params": params,
                                        "version": version, "reason": reason[:1024]})


class PoolDeletion(Event):
    """A signed request to remove pool ``deletes`` up to ``up_to_version`` (what ``dsec
    pool delete`` writes, keyed by the pool's name); its workers run the policies' own
    parameters again."""

    deletes: Identifier
    up_to_version: Version
    signature: Annotated[str, Field(max_length=256)] | None = None
