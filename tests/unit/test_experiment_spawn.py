"""How the experiment starts a worker: lower CPU priority that the kernel honours."""

from __future__ import annotations

import os

from dsec.experiment.runner import WORKER_NICENESS, _spawn_worker


def test_a_worker_shares_the_session_and_runs_at_low_priority(tmp_path) -> None:
    # A worker in a session of its own would be an autogroup of its own where the kernel
    # groups CPU time by session, and its nice value would not rank it below the stacks.
    process = _spawn_worker(dict(os.environ), tmp_path / "worker.log")
    try:
        assert os.getsid(process.pid) == os.getsid(0)
        assert os.getpgid(process.pid) == process.pid  # out of a terminal's Ctrl-C
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == min(
            19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS)
    finally:
        process.kill()
        process.wait()
