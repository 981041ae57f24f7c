"""Policy records from the policies topic, fuzzed: YAML or JSON with CEL conditions.

Whatever a record holds, the registry answers it with an audit record and never raises; a
policy it refuses it refuses with the reason; one it accepts compiles and evaluates on
feature events. The pinned examples are what the fuzzing found, and the issue's poison."""

from __future__ import annotations

from fuzzing import fuzz
from hypothesis import example, given

from dsec.bench.fuzz_inputs import policies, to_json
from dsec.bench.fuzz_targets import policy_record


def _policy(**changes: object) -> bytes:
    return to_json({"name": "fuzz", "condition": "reward_mean > 1.0",
                         "action": {"params": {"kind": "snapshot"}}, **changes})


@fuzz(300)
@given(policies())
# An unclosed flow of 3,000 braces: the pure-Python YAML scanner took seconds over it.
@example(b"{" * 3000)
# A version past 64 bits: accepted, then the encoder could not write it (to sign, to audit).
@example(_policy(version=10**30))
# The issue's: 150 levels of parentheses (a RecursionError in the compiler, once).
@example(_policy(condition="(" * 150 + "reward_mean > 1.0" + ")" * 150))
@example(_policy(condition="not_a_feature > 1.0"))
@example(_policy(condition="undefined_fn(reward_mean) > 1.0"))
@example(_policy(condition="reward_mean.matches('(a+)+$')"))
def test_every_policy_record_is_audited_and_what_runs_evaluates(data: bytes) -> None:
    policy_record(data)
