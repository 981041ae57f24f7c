"""What each worker on a node should be running with, and which commands got it there.

Pure bookkeeping (no I/O): the node actuator asks it whether a command is in
order, what it supersedes, and what to send a worker that registers again. The command
requested for an action and the one in force (the last the worker answered as applied)
are kept apart: a worker that cannot carry a command out, or has not yet, keeps running
the one before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsec.schemas import ActionKind, ActuationCommand

WorkerKey = tuple[str, str]  # (job_id, worker_id)

ONE_SHOT = frozenset({ActionKind.SNAPSHOT})  # an event, not a state to restore


def worker_key(command: ActuationCommand) -> WorkerKey:
    return (command.target.job_id, command.target.worker_id)


@dataclass
class _Slot:
    command: ActuationCommand
    delivered: bool = False
    applied: bool = False


@dataclass
class Accepted:
    superseded: ActuationCommand | None = None  # an older command that will never be sent


@dataclass
class OutOfOrder:
    newer_time_ms: int

    def detail(self, command: ActuationCommand) -> str:
        return (f"out of order: a newer {command.action.kind.value} command "
                f"(t={self.newer_time_ms}) is already in force")


@dataclass
class DesiredStateBook:
    _slots: dict[WorkerKey, dict[ActionKind, _Slot]] = field(default_factory=dict)
    _in_force: dict[WorkerKey, dict[ActionKind, ActuationCommand]] = field(default_factory=dict)

    def accept(self, command: ActuationCommand) -> Accepted | OutOfOrder:
        slots = self._slots.setdefault(worker_key(command), {})
        kind = ActionKind(command.action.kind)
        current = slots.get(kind)
        if current is not None and command.event_time_ms < current.command.event_time_ms:
            return OutOfOrder(current.command.event_time_ms)
        slots[kind] = _Slot(command)
        if current is not None and not current.delivered:
            return Accepted(superseded=current.command)
        return Accepted()

    def mark_delivered(self, key: WorkerKey, actuation_id: str) -> None:
        for slot in self._slots.get(key, {}).values():
            if slot.command.actuation_id == actuation_id:
                slot.delivered = True

    def mark_applied(self, key: WorkerKey, actuation_id: str) -> bool:
        """True when the answer is for the command currently desired."""
        for kind, slot in self._slots.get(key, {}).items():
            if slot.command.actuation_id == actuation_id:
                slot.applied = True
                if kind not in ONE_SHOT:
                    self._in_force.setdefault(key, {})[kind] = slot.command
                return True
        return False

    def mark_not_applied(self, key: WorkerKey, actuation_id: str) -> None:
        """A later answer says a command no longer holds (a cap lifted because the live
        memory outgrew it): it stays desired, and is no longer in force."""
        for slot in self._slots.get(key, {}).values():
            if slot.command.actuation_id == actuation_id:
                slot.applied = False
        in_force = self._in_force.get(key, {})
        for kind, command in list(in_force.items()):
            if command.actuation_id == actuation_id:
                del in_force[kind]

    def requested(self, key: WorkerKey) -> dict[ActionKind, ActuationCommand]:
        """The latest command of each action for the worker, applied or not."""
        return {kind: slot.command for kind, slot in self._slots.get(key, {}).items()}

    def in_force(self, key: WorkerKey) -> dict[ActionKind, ActuationCommand]:
        """The last command of each lasting action the worker answered as applied."""
        return dict(self._in_force.get(key, {}))

    def undelivered(self, key: WorkerKey) -> list[ActuationCommand]:
        slots = self._slots.get(key, {}).values()
        return sorted((s.command for s in slots if not s.delivered),
                      key=lambda c: c.event_time_ms)

    def desired(self, key: WorkerKey) -> list[ActuationCommand]:
        """The state to re-send a worker that registers again: the latest applied (or
        delivered and still unanswered) command of each lasting action."""
        slots = self._slots.get(key, {})
        return sorted(
            (slot.command for kind, slot in slots.items()
             if kind not in ONE_SHOT and slot.delivered),
            key=lambda c: c.event_time_ms,
        )

    def forget_answered(self, key: WorkerKey, actuation_id: str) -> None:
        """A one-shot command the worker answered is done; a newer one of its kind that
        replaced it in the book (delivered or not) stays until its own answer."""
        slots = self._slots.get(key, {})
        for kind in ONE_SHOT:
            slot = slots.get(kind)
            if slot is not None and slot.command.actuation_id == actuation_id:
                del slots[kind]

    def workers(self) -> list[WorkerKey]:
        return list(self._slots)

    def commands(self) -> list[ActuationCommand]:
        return [slot.command for slots in self._slots.values() for slot in slots.values()]
