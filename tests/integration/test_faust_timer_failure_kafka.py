"""A Faust timer that raises is not only logged: the app crashes, the worker's health
check says so, and the worker returns, so the stack's process ends and is restarted (on the
session broker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dsec.schemas.settings import DsecSettings

WORKER = Path(__file__).resolve().parents[1] / "faust_timer_worker.py"
FAILING_CALL = 6  # as in the worker


def test_a_failing_timer_crashes_the_worker_and_its_health_says_so(
        settings: DsecSettings) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), settings.bootstrap, f"{settings.topic_prefix}-app",
         str(settings.data_dir)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"exited": True}, done.stdout[-2000:] + done.stderr[-2000:]
    *reports, last = lines[:-1]
    assert any(r["healthy"] for r in reports), reports  # it ran, healthy, before the failure
    assert not last["healthy"] and last["timer_calls"] == FAILING_CALL, last
    assert "crashed: RuntimeError('the timer failed')" in last["checks"]["faust-worker"]
