"""The built-in policy pack shipped with dsec (``builtin/*.yaml``)."""

from __future__ import annotations

from importlib import resources

import yaml

from dsec.schemas import PolicySpec


def load_builtin_policies() -> list[PolicySpec]:
    folder = resources.files("dsec.policy_engine").joinpath("builtin")
    policies = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.name.endswith(".yaml"):
            policies.append(PolicySpec.model_validate(yaml.safe_load(entry.read_text())))
    return policies
