"""The built-in policy pack shipped with dsec (``builtin/*.yaml``), one policy a file.

Defaults are overridable two ways: per-installation parameter overrides given at load
(``DSEC_POLICY_PARAMS``), or a newer version published on the policies topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from dsec.policy_engine.registry import PolicyRejected, parse_policy
from dsec.schemas import PolicySpec


def load_builtin_policies(
    params: Mapping[str, Mapping[str, float]] | None = None,
    *,
    dry_run: bool = False,
) -> list[PolicySpec]:
    """The pack, with ``params[name]`` merged into each policy's parameters (every one in
    dry run when ``dry_run``). Unsigned: the pack is part of the installed code, and the
    registry runs it with ``install_trusted``."""
    folder = resources.files("dsec.policy_engine").joinpath("builtin")
    overrides = dict(params or {})
    policies = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".yaml"):
            continue
        policy = parse_policy(entry.read_text())
        override = overrides.pop(policy.name, None)
        if override:
            unknown = sorted(set(override) - set(policy.params))
            if unknown:
                raise PolicyRejected(f"{policy.name} has no parameters {', '.join(unknown)}")
            body = policy.model_dump(mode="json", exclude_none=True)
            policy = PolicySpec.model_validate({**body, "params": {**policy.params, **override}})
        if dry_run:
            policy = policy.model_copy(update={"dry_run": True})
        policies.append(policy)
    if overrides:
        raise PolicyRejected(f"no built-in policies named {', '.join(sorted(overrides))}")
    return policies
