"""Waiting in a service's main thread for SIGINT/SIGTERM; and SIGTERM unwinding a run.

The handler only appends to a list. A handler that sets a ``threading.Event`` takes the
Event's lock, and a second signal that lands while the first handler holds it runs the
handler again on the same thread, which then waits for its own lock for ever: a sink
stopped that way kept the embedded store locked, and the stack that replaced it could not
open it.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class StopSignals:
    """Installs the handlers at construction; ``wait`` returns once one of the signals came."""

    def __init__(self, signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
                 poll_s: float = 0.2) -> None:
        self.received: list[int] = []
        self._poll_s = poll_s
        for signum in signums:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)  # no lock taken: safe however often it runs

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once a signal came; False when ``timeout_s`` passed first (None: no limit)."""
        deadline_s = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while not self.received:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                return False
            time.sleep(min(self._poll_s, left_s))
        return True


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Inside, SIGTERM raises ``SystemExit(143)`` in the main thread, so the caller's
    ``finally`` stops what it started (the default action ends the process at once and
    leaves its children running). A second SIGTERM does not cut that cleanup short. Off
    the main thread, where no handler can be installed, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _unwind(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
