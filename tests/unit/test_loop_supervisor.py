"""A loop that dies is restarted, and reported down until it runs again."""

from __future__ import annotations

import threading

from dsec.infra.observability import ProcessMetrics
from dsec.infra.supervisor import LoopSupervisor, restart_delay_s


def test_restart_delays_double_up_to_the_cap() -> None:
    assert [restart_delay_s(n, 0.5, 3.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_dying_loop_is_restarted_and_health_fails_while_it_is_down() -> None:
    stop = threading.Event()
    runs = 0
    died, restart, running = threading.Event(), threading.Event(), threading.Event()

    def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            died.set()
            raise RuntimeError("poison")
        running.set()
        stop.wait()

    metrics = ProcessMetrics()
    # The wait before the restart ends when the test says so.
    supervisor = LoopSupervisor(loop, "test loop", stop, first_delay_s=3600,
                                backoff_wait=lambda _delay_s: restart.wait())
    metrics.add_health_check("loop", supervisor.down)
    supervisor.start()
    assert died.wait(10)
    while supervisor.restarts == 0:
        died.wait(0.01)
    healthy, checks = metrics.health()
    assert not healthy and "RuntimeError: poison" in checks["loop"]
    restart.set()
    assert running.wait(10)
    assert metrics.health()[0] and supervisor.restarts == 1
    stop.set()
    assert supervisor.join(10)

