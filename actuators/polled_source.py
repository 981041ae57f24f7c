"""Commands fetched by the worker itself: the in-process actuator's source in endpoint mode.

A worker in endpoint mode reaches the ingest gateway and nothing else; the gateway keeps
its checked commands until it asks. One thread asks again and again (a long poll the
gateway holds open until a command is there), decodes what comes and hands each command
on, as ``CommandSource`` does with the actuation topic's; the in-process actuator checks
it again at its gate and applies it at a step boundary.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dsec.schemas import ActuationCommand, DecodeError, decode

log = logging.getLogger(__name__)


class CommandPoll(Protocol):
    def fetch(self, wait_s: float) -> list[bytes] | None:
        """The commands waiting (each one's JSON), after waiting up to ``wait_s`` for one;
        None when the gateway could not be asked."""

    def interrupt(self) -> None:
        """Ends a fetch under way at once (called from another thread)."""


@dataclass(frozen=True)
class PollConfig:
    wait_s: float = 20.0  # how long the gateway holds one poll open
    backoff_min_s: float = 0.5  # after a failed poll, doubling up to the max
    backoff_max_s: float = 5.0


class PolledCommandSource:
    def __init__(self, poll: CommandPoll, take: Callable[[ActuationCommand], Any],
                 undecodable: Callable[[bytes | None, str], None],
                 config: PollConfig | None = None,
                 thread_name: str = "dsec-command-poll") -> None:
        self._poll = poll
        self._take = take
        self._undecodable = undecodable
        self._config = config or PollConfig()
        self._stop = threading.Event()
        self._ready = threading.Event()  # a first poll came back, whatever it said
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self.fetched = 0

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether a first poll came back within ``timeout_s`` (a gateway that cannot be
        reached does not hold the worker up for longer than one request)."""
        return self._ready.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._poll.interrupt()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff_s = 0.0
        while not self._stop.is_set():
            # the first poll is answered at once, so that start() does not wait on it
            wait_s = self._config.wait_s if self._ready.is_set() else 0.0
            try:
                values = self._poll.fetch(wait_s)
            except Exception:  # the poll outlives any one bad answer
                log.exception("dsec: the command poll failed")
                values = None
            self._ready.set()
            if self._stop.is_set():
                return
            if values is None:
                backoff_s = min(self._config.backoff_max_s,
                                max(self._config.backoff_min_s, backoff_s * 2))
                self._stop.wait(backoff_s)
                continue
            backoff_s = 0.0
            for value in values:
                self.fetched += 1
                self._receive(value)

    def _receive(self, value: bytes) -> None:
        try:
            command = decode(value, ActuationCommand)
        except DecodeError as exc:
            self._undecodable(value, exc.reason)
            return
        try:
            self._take(command)
        except Exception:
            log.exception("dsec: a fetched command was not taken")
