"""Services wait for SIGINT/SIGTERM without taking a lock in the handler, so a burst of
signals (a supervisor's TERM and its parent's death signal together) cannot wedge them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from dsec.infra.stop_signals import StopSignals


def test_wait_returns_on_a_signal_and_times_out_without_one() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        stop = StopSignals((signal.SIGTERM,), poll_s=0.01)
        assert stop.wait(timeout_s=0.05) is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(timeout_s=5) is True
        assert stop.received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_burst_of_signals_stops_the_service_instead_of_wedging_it() -> None:
    for _ in range(5):
        service = subprocess.Popen(
            [sys.executable, "-c",
             "from dsec.infra.stop_signals import StopSignals\n"
             "stop = StopSignals()\n"
             "print('ready', flush=True)\n"
             "stop.wait()\n"
             # Past here the burst is no longer StopSignals' to take: at exit the
             # interpreter puts back the default handlers, and a late signal from a
             # descheduled sender would then kill the process instead.
             "import signal\n"
             "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"],
            stdout=subprocess.PIPE, text=True)
        assert service.stdout.readline().strip() == "ready"
        for index in range(200):
            try:
                os.kill(service.pid, signal.SIGTERM if index % 2 else signal.SIGINT)
            except ProcessLookupError:
                break
        assert service.wait(timeout=30) == 0


def test_sigterm_unwinds_a_run_through_its_cleanup_once(tmp_path) -> None:
    # The goodput experiment's broker, stacks and workers are stopped in a ``finally``;
    # SIGTERM's default action would skip it and leave them running.
    import time

    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    run = subprocess.Popen(
        [sys.executable, "-c",
         "import os, signal, time\n"
         "from pathlib import Path\n"
         "from dsec.infra.stop_signals import exit_on_sigterm\n"
         "with exit_on_sigterm():\n"
         "    try:\n"
         f"        Path({str(ready)!r}).touch()\n"
         "        time.sleep(60)\n"
         "    finally:\n"
         "        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored\n"
         f"        Path({str(cleaned)!r}).touch()\n"])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    run.terminate()
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    assert cleaned.exists()
