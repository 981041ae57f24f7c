"""A setting the actuator requests and the training loop takes up where it uses it.

``requested`` is what the last command asked for (the worker's own ``original`` until
one does, and again after an undo to ``original``); ``in_force`` is what the loop last
ran with, recorded where it uses the setting (``take``). A command is applied once the
loop has used the setting since the switch, read back; where the loop never used it,
nothing would carry the command out, and it is unsupported, with the line that would
attach it. The requested value is kept either way: a loop that attaches later runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

from dsec.actuators.effects import Effect, Pending
from dsec.schemas.actuations import ORIGINAL

Value = TypeVar("Value")

# How long a switch waits for a loop that has used the setting before to use it again.
TAKE_UP_MAX_S = 120.0


class LoopSetting(Generic[Value]):
    what: ClassVar[str]  # names the setting in results: "autocast", "sync priority", …
    unattached: ClassVar[str]  # why nothing carries a command out before the loop attaches
    attach_hint: ClassVar[str]  # the one line of a training script that attaches it

    def __init__(self, original: Value, *, take_up_max_s: float = TAKE_UP_MAX_S,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.original = original
        self.requested = original
        self.in_force: Value | None = None
        self.uses = 0
        self.registered = False  # the loop's hook is in place, whether or not it has run
        self.switches = 0
        self._commanded = False
        self._take_up_max_s = take_up_max_s
        self._clock_s = clock_s

    @property
    def attached(self) -> bool:
        return self.registered or self.uses > 0

    def mark_attached(self) -> None:
        """The loop's hook is in place: it takes the setting from its next use on, so a
        command that comes before that use (the node's desired state, given back to a
        worker that restarted) waits for it rather than being unsupported."""
        self.registered = True

    def own(self, value: Value) -> None:
        """The worker's own setting: what it runs until a command asks otherwise, and what
        an undo to ``original`` returns to."""
        self.original = value
        if not self._commanded:
            self.requested = value

    def take(self, value: Value) -> Value:
        """The loop runs with ``value`` from now (the requested one, or what its
        data-parallel group agreed on); returns it."""
        self.in_force = value
        self.uses += 1
        return value

    def request(self, value: Value | str) -> Effect | Pending:
        """A command's value (``original``: the worker's own); pending until the loop has
        used the setting since, unsupported when the loop does not use it."""
        target: Value = self.original if value == ORIGINAL else value  # type: ignore[assignment]
        previous, self.requested = self.requested, target
        self._commanded = True
        if target != previous:
            self.switches += 1
        if not self.attached:
            return Effect.unsupported(f"{self.what} {previous} -> {target}", self.unattached,
                                      self.attach_hint, target, self.in_force)
        mark, asked_s = self.uses, self._clock_s()

        def settle() -> Effect | None:
            if self.uses > mark and self._taken_up(target):
                return Effect.applied(self.applied_detail(previous, target), target,
                                      self.in_force)
            if self._clock_s() - asked_s < self._take_up_max_s:
                return None
            return Effect.unsupported(
                f"{self.what} {previous} -> {target}",
                f"the loop has not used it for {self._take_up_max_s:.0f} s since the switch",
                self.attach_hint, target, self.in_force)

        return Pending(settle)

    def _taken_up(self, target: Value) -> bool:
        """Whether a use since the switch carried it out (any use, by default: a group may
        agree on another value, which the result then shows beside the requested one)."""
        return True

    def applied_detail(self, previous: Value, target: Value) -> str:
        detail = f"{self.what} {previous} -> {self.in_force}"
        if self.in_force != target:
            detail += f" ({target} requested; the loop runs {self.in_force})"
        return detail

    def state(self) -> dict[str, Value | None]:
        return {"requested": self.requested, "in_force": self.in_force,
                "original": self.original}
