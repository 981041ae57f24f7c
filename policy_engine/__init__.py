"""Policy engine: policies as data (CEL conditions over features, compiled to numpy) that
emit signed actuation commands, published and hot-reloaded as events."""

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.conditions import CompiledCondition, ConditionError
from dsec.policy_engine.decide import PolicyState, decide
from dsec.policy_engine.engine import Engine, EngineOutput
from dsec.policy_engine.registry import (
    CompiledPolicy,
    PolicyRegistry,
    PolicyRejected,
    compile_policy,
    parse_policy,
)
from dsec.policy_engine.trace import Replay, read_trace, replay
from dsec.policy_engine.vectorised import VectorCondition

__all__ = [
    "CompiledCondition",
    "CompiledPolicy",
    "ConditionError",
    "Engine",
    "EngineOutput",
    "PolicyRegistry",
    "PolicyRejected",
    "PolicyState",
    "Replay",
    "VectorCondition",
    "compile_policy",
    "decide",
    "load_builtin_policies",
    "parse_policy",
    "read_trace",
    "replay",
]
