"""One atheris run of one fuzz target: ``python -m dsec.bench.fuzz_atheris TARGET
[libFuzzer flags]``, started by ``dsec bench fuzz`` (libFuzzer ends the process when its
time is up, or at the first input that breaks the rule, writing that input out).

The dsec modules are instrumented for coverage, so the fuzzer steers towards inputs that
reach new branches of the decoders. ``packed-columns`` builds a batch of packed columns
from the fuzzer's bytes (a kind, its fields, each a dtype and the column's bytes, or a
list of numbers); ``policy`` hands the bytes to the policy decoder as they are, or as the
condition of an otherwise valid policy, so that the CEL checks are reached as often as
the YAML parser.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from typing import Any

import atheris

with atheris.instrument_imports(include=["dsec"]):
    from dsec.bench.fuzz_targets import NOW_MS, metric_batch, policy_record
    from dsec.schemas.fast_decode import RULES

KINDS = sorted(RULES)
DTYPES = ["<f8", "<f4", "<i8", "|b1", "<i4", ">f8", ""]
IDENTITY = {"job_id": "j", "worker_id": "w", "node_id": "n"}


def _column(provider: atheris.FuzzedDataProvider, n: int) -> Any:
    form = provider.ConsumeIntInRange(0, 3)
    if form == 0:  # packed: a dtype, and bytes of about the right length
        dtype = provider.PickValueInList(DTYPES)
        raw = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 8 * n + 2))
        return {"dtype": dtype, "data": base64.b64encode(raw).decode()}
    if form == 1:  # packed, but the data as text (not always base64)
        return {"dtype": provider.PickValueInList(DTYPES),
                "data": provider.ConsumeUnicodeNoSurrogates(provider.ConsumeIntInRange(0, 16))}
    if form == 2:
        return provider.ConsumeIntListInRange(n, 0, NOW_MS + 10**6)
    return provider.ConsumeRegularFloatList(n)


def packed_columns(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    columns: dict[str, Any] = {}
    for _ in range(provider.ConsumeIntInRange(1, 2)):
        kind = provider.PickValueInList(KINDS)
        n = provider.ConsumeIntInRange(0, 6)
        fields = {"event_time_ms": {"dtype": "<i8", "data": base64.b64encode(
            b"".join(t.to_bytes(8, "little") for t in [NOW_MS] * n)).decode()}}
        for name in RULES[kind]:
            if name != "event_time_ms" and provider.ConsumeBool():
                fields[name] = _column(provider, n)
        if provider.ConsumeProbability() < 0.1:
            fields["event_time_ms"] = _column(provider, n)
        columns[kind] = fields
    document = {"identity": IDENTITY, "columns": columns}
    metric_batch(json.dumps(document, allow_nan=True).encode())


def policy(data: bytes) -> None:
    if not data or data[0] % 2:
        policy_record(data[1:])
        return
    condition = atheris.FuzzedDataProvider(data[1:]).ConsumeUnicodeNoSurrogates(len(data))
    policy_record(json.dumps({"name": "fuzz", "condition": condition, "params": {"x": 1.0},
                              "action": {"params": {"kind": "snapshot"}}}).encode())


TARGETS: dict[str, Callable[[bytes], None]] = {"packed-columns": packed_columns,
                                               "policy": policy}


def main() -> None:
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
