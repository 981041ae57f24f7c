"""Policy engine: policies as data (CEL conditions over features) that emit actuation commands."""

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.conditions import CompiledCondition, ConditionError
from dsec.policy_engine.decide import PolicyState, decide

__all__ = [
    "CompiledCondition",
    "ConditionError",
    "PolicyState",
    "decide",
    "load_builtin_policies",
]
