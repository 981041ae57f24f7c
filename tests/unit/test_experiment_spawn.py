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


def test_the_launcher_kills_the_hung_member_only_where_its_arm_watches_progress(
        tmp_path) -> None:
    import subprocess
    import sys
    import time

    from dsec.experiment.progress import ProgressBeat, WatchdogConfig
    from dsec.experiment.runner import _restart_stuck, _Slot

    now = time.time()
    slots = []
    for arm in ("plain", "strong"):
        for index in (0, 1):
            process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            slots.append(_Slot(arm, index, process, assigned_at=now - 30))
            beat = ProgressBeat(tmp_path / arm / "beats" / f"worker-{index:03d}")
            beat.record_update(0.5)
            # worker 0 stopped stepping 20 s ago; worker 1 waits on it in an all-reduce
            stopped = now - 20 + 5 * index
            os.utime(beat.path, (stopped, stopped))
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a replacement assigned 60 s ago that has not beaten yet is still starting
    slots.append(_Slot("strong", 2, starting, assigned_at=now - 60))
    try:
        _restart_stuck(slots, tmp_path, now, WatchdogConfig(8.0, 4.0), 30.0, set(), 2)
        assert starting.poll() is None
        assert [s.process.poll() is None for s in slots[:4]] == [True, True, False, True]
        timeline = (tmp_path / "strong" / "timeline-000.jsonl").read_text()
        assert '"cause": "hang"' in timeline
        # plain: once a member died (here, of its collective timeout), what is still stuck
        # past the collective timeout is torn down
        _restart_stuck(slots[:2], tmp_path, now + 12, WatchdogConfig(8.0, 4.0), 30.0,
                       {("plain", 0)}, 2)
        assert [s.process.poll() is None for s in slots[:2]] == [False, True]
    finally:
        for slot in slots:
            slot.process.kill()
            slot.process.wait()
