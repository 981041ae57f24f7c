"""A single-process actuator: the probe consumes its own commands, without a node daemon.

A ``CommandSource`` reads the actuation topic from the moment of start (every partition,
by assignment, nothing committed), keeps the commands keyed to this worker's node and
addressed to this worker, and queues them; the training thread runs them through the
``CommandPipeline`` at its next step boundary (``apply_pending``), where changing the
model, optimizer or precision is safe, so a command is checked (signature, expiry,
duplicates) when it is applied, and its result is published back. In endpoint mode the
worker fetches its commands from the ingest gateway instead (``poll``:
``PolledCommandSource``), and its results go back through the gateway with its metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from dsec.actuators.apply_hooks import ApplyHooks
from dsec.actuators.command_source import CommandSource, dead_letters_to
from dsec.actuators.desired_state import DesiredStateBook, OutOfOrder
from dsec.actuators.gate import CommandGate
from dsec.actuators.pipeline import Applier, CommandPipeline, Outcome
from dsec.actuators.polled_source import CommandPoll, PolledCommandSource
from dsec.actuators.results import Publish, ResultPublisher
from dsec.actuators.step_queue import StepBoundaryQueue
from dsec.infra.consumer_loop import ConsumerLoopConfig, Start
from dsec.schemas import ActuationCommand, ActuationStatus, Verifier, WorkerIdentity
from dsec.schemas.actuations import COMMAND_MAX_FUTURE_MS

log = logging.getLogger(__name__)

SERVICE = "in-process-actuator"
POLL_TIMEOUT_S = 0.2


class HookApplier(Applier):
    """Applies through the worker's apply hooks, on the calling (training) thread, and
    refuses a command older than the one in force for its action. A command the loop
    takes up later is reported from ``settle``."""

    def __init__(self, hooks: ApplyHooks, results: ResultPublisher) -> None:
        self.hooks = hooks
        self._results = results
        self._order = DesiredStateBook()
        self._pending: dict[str, ActuationCommand] = {}

    def apply(self, command: ActuationCommand) -> Outcome | None:
        verdict = self._order.accept(command)
        if isinstance(verdict, OutOfOrder):
            return Outcome(ActuationStatus.STALE, verdict.detail(command))
        effect = self.hooks.try_apply(command.action, command.actuation_id)
        if command.actuation_id in self.hooks.pending().values():
            self._pending[command.actuation_id] = command  # a later result will come
        if effect is None:
            return None
        return Outcome(effect.status, effect.detail, effect.requested, effect.in_force)

    def settle(self) -> int:
        """Reports the commands the loop has taken up since the last call; how many."""
        reported = 0
        for settled in self.hooks.settle():
            command = self._pending.get(settled.actuation_id or "")
            if command is None:
                continue
            effect = settled.effect
            self._results.report(command, effect.status, effect.detail,
                                 requested=effect.requested, in_force=effect.in_force)
            reported += 1
        waiting = set(self.hooks.pending().values())
        for actuation_id in [a for a in self._pending if a not in waiting]:
            del self._pending[actuation_id]
        return reported


class InProcessActuator:
    def __init__(
        self,
        identity: WorkerIdentity,
        consumer_config: dict,
        actuations_topic: str,
        results_topic: str,
        hooks: ApplyHooks,
        verifier: Verifier,
        publish: Publish,
        on_command: Callable[[], None] = lambda: None,
        max_future_ms: int = COMMAND_MAX_FUTURE_MS,
        dead_letters_topic: str | None = None,
        consumer_factory: Callable[[dict], Any] = Consumer,
        poll: CommandPoll | None = None,
    ) -> None:
        """``on_command`` is called (on the consumer's thread) after a command is queued for
        ``apply_pending``: the probe's ``wake``, so that the next step boundary applies it.
        ``consumer_factory``: the Kafka client, ``confluent_kafka.Consumer`` but in tests.
        ``poll``: fetch the commands from the gateway rather than the actuation topic."""
        self.identity = identity
        self.hooks = hooks
        self._results = ResultPublisher(results_topic, publish, service=SERVICE)
        self._applier = HookApplier(hooks, self._results)
        self._pipeline = CommandPipeline(
            CommandGate(identity, verifier, max_future_ms=max_future_ms),
            self._applier, self._results)
        self._queue: StepBoundaryQueue[ActuationCommand] = StepBoundaryQueue(on_command)
        self.polls = poll is not None
        self._source: CommandSource | PolledCommandSource
        if poll is not None:
            self._source = PolledCommandSource(poll, self._queue_if_addressed,
                                               self._pipeline.undecodable)
            return
        self._source = CommandSource(
            ConsumerLoopConfig((actuations_topic,), str(consumer_config.get("group.id", SERVICE)),
                               poll_timeout_s=POLL_TIMEOUT_S, assign=True, start=Start.END,
                               commit=False, return_on_first=True),
            consumer_config, keys=lambda: (identity.node_id,), take=self._queue_if_addressed,
            undecodable=self._pipeline.undecodable,
            dead_letter=dead_letters_to(dead_letters_topic, publish, SERVICE),
            service=SERVICE, thread_name="dsec-actuator", consumer_factory=consumer_factory)

    @property
    def results(self) -> dict[ActuationStatus, int]:
        return self._results.results

    @property
    def undecodable(self) -> int:
        return self._pipeline.counts.undecodable

    def start(self, ready_timeout_s: float = 30.0) -> None:
        self._source.start()
        if ready_timeout_s > 0 and not self._source.wait_ready(ready_timeout_s):
            log.warning("dsec actuator: no assignment after %.0f s; commands may be late",
                        ready_timeout_s)

    def _queue_if_addressed(self, command: ActuationCommand) -> None:
        if self._pipeline.addressed(command):
            self._queue.put(command)

    def apply_pending(self) -> int:
        """Applies queued commands, and reports those the loop has taken up since; call on
        the training thread at a step boundary. Returns how many commands it applied."""
        applied = self._queue.drain(self._pipeline.handle)
        self._applier.settle()
        return applied

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the consumer, waiting up to ``timeout_s`` for it (one stuck asking an
        unreachable broker is left behind, a daemon thread)."""
        self._source.stop(timeout_s)
