"""``dsec bench pipeline``: how it charges CPU time to each side."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dsec.bench.pipeline import _child_pids, _cpu_s, _per_million

linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def test_cpu_per_million_samples() -> None:
    assert _per_million(0.5, 2_000_000) == 0.25
    assert _per_million(None, 1_000) is None
    assert _per_million(1.0, 0) is None


@linux_only
def test_a_process_cpu_time_grows_as_it_works() -> None:
    before = _cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = _cpu_s(os.getpid())
    assert before is not None and after is not None and after > before


@linux_only
def test_a_child_is_found_and_a_gone_process_has_no_cpu_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in _child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert _cpu_s(child.pid) is None
