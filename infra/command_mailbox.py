"""Commands waiting for the runtimes that fetch their own (registered with ``"delivery":
"poll"``): the webhook forwarder puts each checked command here, the gateway hands them
out on the runtime's poll and takes back the results of the ones it handed out.

Bounded per runtime: a runtime that does not poll fills its box and the next command is
refused. A command that expires in the box is handed to ``on_expired`` (the gateway
reports it stale) instead of to the runtime. Thread-safe: the forwarder puts on its
consumer's thread, the gateway takes on its event loop.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from dsec.schemas import ActuationCommand, now_ms


@dataclass(frozen=True)
class MailboxConfig:
    max_commands_per_runtime: int = 64
    # the commands handed out whose results a runtime may still post, per runtime
    delivered_remembered: int = 256


class CommandMailbox:
    def __init__(self, config: MailboxConfig | None = None,
                 on_expired: Callable[[ActuationCommand], None] = lambda _command: None,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self._config = config or MailboxConfig()
        self._on_expired = on_expired
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[ActuationCommand]] = {}
        self._delivered: dict[str, OrderedDict[str, ActuationCommand]] = {}

    def put(self, command: ActuationCommand) -> bool:
        """Queues ``command`` for its target runtime; False when that runtime's box is full."""
        with self._lock:
            box = self._waiting.setdefault(command.target.worker_id, deque())
            if len(box) >= self._config.max_commands_per_runtime:
                return False
            box.append(command)
            return True

    def waiting(self, runtime_id: str) -> int:
        with self._lock:
            return len(self._waiting.get(runtime_id, ()))

    def take(self, runtime_id: str) -> list[ActuationCommand]:
        """The runtime's commands that have not expired, oldest first, now handed out."""
        now = self._clock_ms()
        with self._lock:
            box = self._waiting.pop(runtime_id, None)
            if not box:
                return []
            live = [command for command in box if command.expires_at_ms > now]
            expired = [command for command in box if command.expires_at_ms <= now]
            delivered = self._delivered.setdefault(runtime_id, OrderedDict())
            for command in live:
                delivered[command.actuation_id] = command
            while len(delivered) > self._config.delivered_remembered:
                delivered.popitem(last=False)
        for command in expired:
            self._on_expired(command)
        return live

    def delivered(self, runtime_id: str, actuation_id: str) -> ActuationCommand | None:
        """The command handed out to ``runtime_id`` under that id, if it was."""
        with self._lock:
            return self._delivered.get(runtime_id, {}).get(actuation_id)
