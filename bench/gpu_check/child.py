"""Runs one check in this process and prints its outcome as the last line of JSON:
``python -m dsec.bench.gpu_check.child module:function``."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from dataclasses import asdict

from dsec.bench.gpu_check.outcome import Outcome


def run(target: str) -> dict:
    started_s = time.monotonic()
    module_name, _, function_name = target.partition(":")
    try:
        check = getattr(importlib.import_module(module_name), function_name)
        outcome = check()
    except Exception as exc:
        tail = traceback.format_exc().strip().splitlines()[-6:]
        outcome = Outcome("failed", f"{type(exc).__name__}: {exc}", {"traceback": tail})
    return {**asdict(outcome), "wall_s": round(time.monotonic() - started_s, 2)}


def main() -> None:
    result = run(sys.argv[1])
    print(json.dumps(result, default=str), flush=True)
    # NCCL's and gloo's threads can abort the interpreter's own exit; the answer is out
    os._exit(0)


if __name__ == "__main__":
    main()
