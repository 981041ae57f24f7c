"""The experiment's spares forked from one warmed process: ready, assigned, killed, reaped
with their exit status, and ended with their server."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from dataclasses import asdict

import pytest

from dsec.experiment.assignment import Assignment
from dsec.experiment.runner import FORK_SERVER_MODULE, _assign, _spawn_worker, _wait_ready
from dsec.experiment.warm_forks import EXIT_UNKNOWN, fork_spare

pytestmark = pytest.mark.timeout(300)  # the server warms up at nice 19


def _parent_of(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_spares_fork_from_the_warm_server_and_report_how_they_ended(tmp_path) -> None:
    server = _spawn_worker(dict(os.environ), tmp_path / "fork-server.log",
                           module=FORK_SERVER_MODULE)
    try:
        spares = [fork_spare(server, tmp_path / "spare.log") for _ in range(3)]
        _wait_ready([server, *spares], time.monotonic() + 240)
        pids = [spare.pid for spare in spares]
        assert len(set(pids)) == 3 and all(_parent_of(pid) == server.pid for pid in pids)
        # Forked: a spare is ready in a fraction of the warm-up a new interpreter needs.
        asked_s = time.monotonic()
        late = fork_spare(server, tmp_path / "spare.log")
        _wait_ready([late], time.monotonic() + 60)
        assert time.monotonic() - asked_s < 30

        spares[0].kill()
        assert spares[0].wait(timeout=30) == -signal.SIGKILL
        assert spares[0].poll() == -signal.SIGKILL  # asked again: the same answer
        spares[0].kill()  # already gone: nothing to do

        # The assignment reaches the spare, which runs it (here: a scenario file that does
        # not exist, so the worker fails, with its traceback in the spare's log).
        assignment = Assignment(
            arm="plain", slot=0, group=0, rank=0, group_size=1, node_id="node-00",
            store_port=1, run_dir=str(tmp_path), scenario_file=str(tmp_path / "missing.json"),
            t0_s=time.time(), end_at_s=time.time() + 5, seed=0, incarnation=0, job_id="job")
        _assign(spares[1], assignment)
        assert spares[1].wait(timeout=60) == 1
        assert "missing.json" in (tmp_path / "spare.log").read_text()
        assert json.loads(spares[1].ready_file.with_name(
            spares[1].ready_file.name + ".assignment").read_text()) == asdict(assignment)

        # Stdin closed: the server ends the spares nobody assigned, then itself.
        assert server.stdin is not None
        server.stdin.close()
        assert server.wait(timeout=30) == 0
        assert spares[2].wait(timeout=5) == -signal.SIGKILL
        assert late.wait(timeout=5) == -signal.SIGKILL
    finally:
        server.kill()
        server.wait()


def test_a_spare_not_assigned_ends_with_a_server_that_was_killed(tmp_path) -> None:
    server = _spawn_worker(dict(os.environ), tmp_path / "fork-server.log",
                           module=FORK_SERVER_MODULE)
    try:
        spare = fork_spare(server, tmp_path / "spare.log")
        _wait_ready([spare], time.monotonic() + 240)
        pidfd = os.pidfd_open(spare.pid)
    finally:
        server.kill()
        server.wait()
    # No one reaps it for us, so its status is unknown; it is gone all the same.
    assert spare.wait(timeout=30) == EXIT_UNKNOWN
    deadline = time.monotonic() + 30
    while not select.select([pidfd], [], [], 0.1)[0]:
        assert time.monotonic() < deadline
    os.close(pidfd)
