"""The probe's side work (step callbacks, collectors, a norm it cannot take): what fails is
logged, never raised into the loop that runs it, and a failure that repeats at step or
flush rate is logged once."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Callback = Callable[[], None]


class Callbacks:
    def __init__(self, what: str, log_each_failure: bool = True) -> None:
        """``what`` names them in the log; ``log_each_failure=False`` logs one failure per
        callback (for those called every flush, which would fill the log)."""
        self._what = what
        self._log_each_failure = log_each_failure
        self._callbacks: list[Callback] = []
        self._failed: set[int] = set()

    def add(self, callback: Callback) -> None:
        self._callbacks.append(callback)

    def run(self) -> None:
        for index, callback in enumerate(self._callbacks):
            try:
                callback()
            except Exception:  # telemetry never crashes the loop that runs it
                if self._log_each_failure:
                    log.exception("dsec %s failed", self._what)
                elif index not in self._failed:
                    self._failed.add(index)
                    log.exception("dsec %s %r failed; it keeps being called", self._what,
                                  callback)


class WarnOnce:
    """Logs the exception being handled, once per ``what``."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def __call__(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.exception(message)
