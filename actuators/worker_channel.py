"""The worker's end of the node channel: registers, queues commands, applies them at a
step boundary on the training thread, and answers.

A reader thread keeps (re)connecting to the node actuator's socket and registers
each time, so a restarted daemon or worker finds the other again and the desired
state flows back. Nothing here raises into the training loop.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from dsec.actuators.apply_hooks import ApplyHooks
from dsec.actuators.channel import (
    Answer,
    Apply,
    ChannelError,
    Register,
    encode_frame,
    read_frame,
)
from dsec.actuators.effects import Effect
from dsec.actuators.step_queue import StepBoundaryQueue
from dsec.schemas import ActuationStatus, WorkerIdentity

log = logging.getLogger(__name__)


class WorkerChannel:
    def __init__(
        self,
        identity: WorkerIdentity,
        path: Path,
        hooks: ApplyHooks,
        reconnect_interval_s: float = 0.5,
        remember: int = 10_000,
        max_unsent: int = 1_000,
        on_command: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_command`` is called (on the channel's thread) after a command is queued for
        ``apply_pending``: the probe's ``wake``, so that the next step boundary applies it."""
        self.identity = identity
        self.path = path
        self.hooks = hooks
        self._reconnect_interval_s = reconnect_interval_s
        self._inbox: StepBoundaryQueue[Apply] = StepBoundaryQueue(on_command)
        self._unsent: list[Answer] = []
        self._max_unsent = max_unsent
        self.answers_dropped = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._replayed: dict[str, bool] = {}  # pending actuation id -> sent as a replay
        self._remember = remember
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0
        self.results: dict[ActuationStatus, int] = dict.fromkeys(ActuationStatus, 0)

    def start(self, ready_timeout_s: float = 5.0) -> WorkerChannel:
        self._thread = threading.Thread(target=self._run, name="dsec-worker-channel",
                                        daemon=True)
        self._thread.start()
        if not self._registered.wait(ready_timeout_s):
            log.warning("dsec: node actuator at %s not reachable yet; retrying", self.path)
        return self

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
                sock.sendall(encode_frame(Register(identity=self.identity, pid=_pid())))
                with self._send_lock:
                    self._sock = sock
                    unsent, self._unsent = self._unsent, []
                for answer in unsent:
                    self._send(answer)
                self.registrations += 1
                self._registered.set()
                while not self._stop.is_set():
                    frame = read_frame(sock)
                    if isinstance(frame, Apply):
                        self._inbox.put(frame)
            except (ChannelError, OSError) as exc:
                if not self._stop.is_set():
                    log.debug("dsec worker channel: %s", exc)
            finally:
                self._registered.clear()
                with self._send_lock:
                    self._sock = None
                sock.close()
            self._stop.wait(self._reconnect_interval_s)

    def apply_pending(self) -> int:
        """Applies queued commands, and answers those the loop has taken up since; call on
        the training thread at a step boundary. Returns how many commands it applied."""
        applied = self._inbox.drain(self._apply)
        for settled in self.hooks.settle():
            if settled.actuation_id is not None:
                self._answer(settled.actuation_id, settled.effect,
                             self._replayed.pop(settled.actuation_id, False))
        return applied

    def _apply(self, frame: Apply) -> None:
        if frame.actuation_id in self._seen and not frame.replay:
            return  # idempotent: the daemon re-sent something already applied here
        self._seen[frame.actuation_id] = None
        if len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        effect = self.hooks.try_apply(frame.action, frame.actuation_id)
        if effect is None or effect.status is ActuationStatus.DEFERRED:
            self._replayed[frame.actuation_id] = frame.replay  # answered when settled
            if len(self._replayed) > self._remember:
                del self._replayed[next(iter(self._replayed))]
        if effect is not None:
            self._answer(frame.actuation_id, effect, frame.replay)

    def _answer(self, actuation_id: str, effect: Effect, replay: bool) -> None:
        self.results[effect.status] += 1
        self._send(Answer(actuation_id=actuation_id, status=effect.status,
                          detail=effect.detail[:2048], replay=replay,
                          requested=effect.requested, in_force=effect.in_force))

    def _send(self, answer: Answer) -> None:
        with self._send_lock:
            sock = self._sock
            if sock is None:
                self._keep_unsent(answer)
                return
            try:
                sock.sendall(encode_frame(answer))
            except OSError:
                self._keep_unsent(answer)

    def _keep_unsent(self, answer: Answer) -> None:
        """Held for the next registration; the oldest go first when the daemon stays away."""
        self._unsent.append(answer)
        if len(self._unsent) > self._max_unsent:
            del self._unsent[0]
            self.answers_dropped += 1

    def stop(self) -> None:
        self._stop.set()
        with self._send_lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _pid() -> int:
    import os

    return os.getpid()
