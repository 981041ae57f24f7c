"""Keeps a service's loop running: a loop that dies is restarted after a backoff, and the
service reports itself down (``/healthz`` 503) until the new run has started."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def restart_delay_s(failures: int, first_s: float, max_s: float) -> float:
    """The wait before restart number ``failures`` (from 1): doubling, capped at ``max_s``."""
    return min(max_s, first_s * 2.0 ** max(0, failures - 1))


class LoopSupervisor:
    """Runs ``loop`` on a thread of its own until ``stop``; an exception out of ``loop``
    is logged and counted, and the loop runs again after ``restart_delay_s``. ``loop``
    returning while not stopped counts as a failure too."""

    def __init__(self, loop: Callable[[], None], name: str, stop: threading.Event,
                 first_delay_s: float = 0.5, max_delay_s: float = 30.0,
                 backoff_wait: Callable[[float], object] | None = None) -> None:
        """``backoff_wait``: how the wait before a restart is waited (default: on ``stop``,
        so that stopping cuts it short)."""
        self._loop = loop
        self._backoff_wait = backoff_wait or stop.wait
        self._name = name
        self._stop = stop
        self._first_delay_s = first_delay_s
        self._max_delay_s = max_delay_s
        self._thread: threading.Thread | None = None
        self._down: str | None = "not started"
        self.restarts = 0
        self.last_failure: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name=self._name, daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Whether the supervising thread is alive (it ends only after ``stop``)."""
        return self._thread is not None and self._thread.is_alive()

    def down(self) -> str | None:
        """Why the loop is not running now, or None while it runs."""
        if not self.running():
            return f"{self._name} is not running"
        return self._down

    def join(self, timeout_s: float) -> bool:
        """Waits for the supervising thread to end; True once it has."""
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        return not self.running()

    def _supervise(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._down = None
            try:
                self._loop()
                if self._stop.is_set():
                    return
                self.last_failure = "the loop returned without being stopped"
            except Exception as exc:
                self.last_failure = f"{type(exc).__name__}: {exc}"
                log.exception("%s died", self._name)
            failures += 1
            self.restarts += 1
            self._down = f"{self._name} died ({self.last_failure}); restart {failures} pending"
            self._backoff_wait(restart_delay_s(failures, self._first_delay_s, self._max_delay_s))
