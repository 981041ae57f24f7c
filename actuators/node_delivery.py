"""The node actuator's applier: a command becomes its worker's desired state and is sent
over the worker's channel; the worker's answer is the command's result.

The desired state is kept in the run directory too, so a restarted daemon still has it,
and a worker that registers again is sent it again.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from dsec.actuators.channel import Answer, Apply, encode_frame
from dsec.actuators.desired_state import DesiredStateBook, OutOfOrder, WorkerKey, worker_key
from dsec.actuators.gate import CommandGate
from dsec.actuators.pipeline import Applier, Outcome
from dsec.actuators.results import DETAIL_MAX_CHARS, ResultPublisher
from dsec.actuators.snapshot_store import write_atomically
from dsec.schemas import (
    ActionKind,
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    SignatureError,
    Verifier,
    WorkerIdentity,
)

log = logging.getLogger(__name__)

SENT_REMEMBERED = 10_000  # commands sent to workers and not yet answered


@dataclass
class DeliveryCounters:
    delivered: int = 0
    registrations: int = 0
    replayed: int = 0


class WorkerConnection:
    """A registered worker's end of the socket; sends are serialised."""

    def __init__(self, sock: socket.socket, identity: WorkerIdentity) -> None:
        self.sock = sock
        self.identity = identity
        self._lock = threading.Lock()

    def send(self, frame: Apply) -> bool:
        try:
            with self._lock:
                self.sock.sendall(encode_frame(frame))
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class NodeDelivery(Applier):
    def __init__(self, state_path: Path, results: ResultPublisher) -> None:
        self._state_path = state_path
        self._results = results
        self._book = DesiredStateBook()
        self._connections: dict[WorkerKey, WorkerConnection] = {}
        # What was sent, by actuation id, until answered: a one-shot command can be replaced
        # in the book by a newer one before the worker answers it.
        self._sent: OrderedDict[str, ActuationCommand] = OrderedDict()
        self._lock = threading.RLock()
        self.counters = DeliveryCounters()

    def apply(self, command: ActuationCommand) -> Outcome | None:
        with self._lock:
            verdict = self._book.accept(command)
            if isinstance(verdict, OutOfOrder):
                return Outcome(ActuationStatus.STALE, verdict.detail(command))
            if verdict.superseded is not None:
                self._results.report(verdict.superseded, ActuationStatus.SUPERSEDED,
                                     f"superseded by {command.actuation_id} before delivery")
            self._save()
            self._deliver(worker_key(command))
        return None

    def commands(self) -> list[ActuationCommand]:
        """Every command in the desired state."""
        with self._lock:
            return self._book.commands()

    def in_force(self, key: WorkerKey) -> dict[ActionKind, ActuationCommand]:
        """The command of each action the worker last answered as applied."""
        with self._lock:
            return self._book.in_force(key)

    def connected_workers(self) -> list[WorkerKey]:
        with self._lock:
            return list(self._connections)

    def register(self, key: WorkerKey, connection: WorkerConnection) -> None:
        """A worker (again) on the channel: its desired state is sent, then what is new."""
        with self._lock:
            old = self._connections.get(key)
            self._connections[key] = connection
            self.counters.registrations += 1
            for command in self._book.desired(key):
                if connection.send(_apply_frame(command, replay=True)):
                    self.counters.replayed += 1
                    self._remember_sent(command)
            self._deliver(key)
        if old is not None and old is not connection:
            old.close()

    def unregister(self, key: WorkerKey, connection: WorkerConnection) -> None:
        with self._lock:
            if self._connections.get(key) is connection:
                del self._connections[key]

    def close_all(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()

    def answered(self, key: WorkerKey, identity: WorkerIdentity, answer: Answer) -> None:
        """A worker's answer, published as the result of the command it answers."""
        with self._lock:
            command = self._sent.pop(answer.actuation_id, None) or next(
                (c for c in self._book.commands() if c.actuation_id == answer.actuation_id),
                None)
            if answer.status is ActuationStatus.APPLIED:
                self._book.mark_applied(key, answer.actuation_id)
            else:
                self._book.mark_not_applied(key, answer.actuation_id)
            self._book.forget_answered(key, answer.actuation_id)
            self._save()
        detail = f"re-applied on registration: {answer.detail}" if answer.replay else answer.detail
        self._results.send(ActuationResult(
            actuation_id=answer.actuation_id, identity=identity,
            action_kind=command.action.kind.value if command else "",
            status=answer.status, detail=detail[:DETAIL_MAX_CHARS],
            command_time_ms=command.event_time_ms if command else None,
            requested=answer.requested, in_force=answer.in_force,
        ))

    def _deliver(self, key: WorkerKey) -> None:
        connection = self._connections.get(key)
        if connection is None:
            return  # kept as desired state until the worker registers
        for command in self._book.undelivered(key):
            if not connection.send(_apply_frame(command, replay=False)):
                return
            self._book.mark_delivered(key, command.actuation_id)
            self._remember_sent(command)
            self.counters.delivered += 1

    def _remember_sent(self, command: ActuationCommand) -> None:
        self._sent[command.actuation_id] = command
        self._sent.move_to_end(command.actuation_id)
        if len(self._sent) > SENT_REMEMBERED:
            self._sent.popitem(last=False)

    def _save(self) -> None:
        body = orjson.dumps([c.model_dump(mode="json", exclude_none=True)
                             for c in self._book.commands()])
        try:
            write_atomically(self._state_path, body)
        except OSError as exc:
            log.warning("dsec node actuator: desired state not saved: %s", exc)

    def load(self, gate: CommandGate, verifier: Verifier) -> None:
        """Commands saved by an earlier run, re-verified (the file is input like any other)
        and remembered by the gate as seen."""
        try:
            saved = orjson.loads(self._state_path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("dsec node actuator: saved desired state unreadable: %s", exc)
            return
        with self._lock:
            for raw in saved if isinstance(saved, list) else []:
                try:
                    command = ActuationCommand.model_validate(raw)
                    verifier.verify(command)
                except (ValidationError, SignatureError) as exc:
                    log.warning("dsec node actuator: dropped a saved command: %s", exc)
                    continue
                gate.check(command, command.event_time_ms)
                self._book.accept(command)
                self._book.mark_delivered(worker_key(command), command.actuation_id)


def _apply_frame(command: ActuationCommand, replay: bool) -> Apply:
    return Apply(actuation_id=command.actuation_id, action=command.action,
                 command_time_ms=command.event_time_ms, replay=replay)
