"""The one way a command is handled, wherever it is applied: the gate, then an applier,
then the result.

``CommandSource`` (``actuators/command_source.py``) takes commands off the actuation
topic; ``CommandPipeline.handle`` checks each at the verify-first ``CommandGate``, hands
what passes to an ``Applier`` (the worker's apply hooks, the node's channel, a runtime's
webhook) and publishes what came of it through the ``ResultPublisher``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from dsec.actuators.gate import CommandGate, Rejection, out_of_bounds_result
from dsec.actuators.results import ResultPublisher
from dsec.schemas import ActuationCommand, ActuationStatus, now_ms

log = logging.getLogger(__name__)

DUPLICATE_DETAIL = "duplicate actuation id: not applied again"


@dataclass(frozen=True)
class Outcome:
    status: ActuationStatus
    detail: str
    requested: str | None = None  # the setting asked for and the one in force, read back
    in_force: str | None = None


class Applier(ABC):
    """Applies a command the gate let through."""

    @abstractmethod
    def apply(self, command: ActuationCommand) -> Outcome | None:
        """What came of it, or None when that is reported later (a worker's answer)."""


@dataclass
class CommandCounts:
    handled: int = 0  # commands addressed here that reached the gate
    undecodable: int = 0


class CommandPipeline:
    def __init__(self, gate: CommandGate, applier: Applier, results: ResultPublisher, *,
                 report_duplicates: bool = False,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        """``report_duplicates``: a command seen already is reported as rejected (the node
        actuator, whose results are the node's audit trail) rather than passed over."""
        self.gate = gate
        self.applier = applier
        self.results = results
        self._report_duplicates = report_duplicates
        self._clock_ms = clock_ms
        self.counts = CommandCounts()

    def addressed(self, command: ActuationCommand) -> bool:
        """Whether the command names a target of this pipeline (unverified: a cheap filter)."""
        return self.gate.addressed_here(command)

    def handle(self, command: ActuationCommand) -> ActuationStatus | None:
        """Gate, apply, report; the status reported, None when nothing was (yet)."""
        if not self.addressed(command):
            return None  # what the gate would say, without verifying a signature first
        self.counts.handled += 1
        rejection = self.gate.check(command, self._clock_ms())
        if rejection is not None:
            return self._rejected(command, rejection)
        outcome = self.applier.apply(command)
        if outcome is None:
            return None
        self.results.report(command, outcome.status, outcome.detail,
                            requested=outcome.requested, in_force=outcome.in_force)
        return outcome.status

    def _rejected(self, command: ActuationCommand,
                  rejection: Rejection) -> ActuationStatus | None:
        if rejection.duplicate and not self._report_duplicates:
            return None
        if not self.gate.reportable(command, rejection):
            return None
        status, detail = rejection.status, rejection.detail
        if rejection.duplicate:
            status, detail = ActuationStatus.REJECTED, DUPLICATE_DETAIL
        self.results.report(command, status, detail)
        return status

    def undecodable(self, value: bytes | None, reason: str) -> None:
        """A message that is not a valid command is reported as rejected when its envelope
        names a target of this pipeline, unless it carries the id of a verified command:
        unsigned as it is, its rejection would land on that command's record."""
        self.counts.undecodable += 1
        result = out_of_bounds_result(value, reason)
        if (result is None or not self.gate.addresses(result.identity)
                or self.gate.known(result.actuation_id)):
            log.warning("%s: undecodable command: %s", self.results.service, reason)
            return
        self.results.send(result)
