"""Checks for the GPU check runner's own tests: one that passes, one that raises, one that
never ends."""

from __future__ import annotations

import time

from dsec.bench.gpu_check import Outcome


def passes() -> Outcome:
    return Outcome("ok", "", {"answer": 42})


def raises() -> Outcome:
    raise RuntimeError("the driver said no")


def hangs() -> Outcome:
    time.sleep(3600)
    return Outcome("ok")
