"""The per (policy, target) states as columns, and which rows of a batch the state
machine would leave exactly as they are.

The engine's state mapping (a Faust table, a dict offline) stays the record: it is read
for a target the first time a policy meets it (or after ``forget_cached``) and written
whenever a state changes. The columns mirror it, a row per target slot, so that a batch's
rows can be sorted at once into those ``decide`` would not touch (a live worker's
snapshot policy cooling down, a ``for:`` timer running) and the few it must run for.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

import numpy as np

from dsec.policy_engine.decide import PolicyState, cooldown_s
from dsec.schemas.policies import PolicySpec
from dsec.schemas.units import duration_ms

__all__ = ["Gathered", "StateBoard", "StateColumns", "Timing", "settled"]

NONE_MS = -(1 << 62)  # no time: far below any event time, and safe to subtract from
_FIELDS_MS = ("pending_since_ms", "last_fired_ms", "stage_since_ms", "clear_since_ms")


@dataclass(frozen=True)
class Timing:
    """A policy's durations in ms and shape, as the state machine reads them."""

    for_ms: float
    cooldown_ms: float
    jitter_ms: float
    stage_interval_ms: float
    hold_ms: float
    stages: int
    one_shot: bool
    resolves_alerts: bool

    @classmethod
    def of(cls, spec: PolicySpec, cooldown_floor_s: float) -> Timing:
        one_shot = spec.one_shot
        return cls(
            for_ms=duration_ms(spec.for_s),
            cooldown_ms=duration_ms(cooldown_s(spec, cooldown_floor_s)),
            jitter_ms=duration_ms(spec.jitter_s),
            stage_interval_ms=duration_ms(spec.stage_interval_s),
            hold_ms=duration_ms(spec.hold_s),
            stages=len(spec.effective_stages()),
            one_shot=one_shot,
            resolves_alerts=bool(spec.alert) and one_shot,
        )


@dataclass
class Gathered:
    """Some rows' states, field by field (times ``NONE_MS`` where None)."""

    pending_since_ms: np.ndarray
    last_fired_ms: np.ndarray
    stage_since_ms: np.ndarray
    clear_since_ms: np.ndarray
    stage: np.ndarray
    suppressed_audited: np.ndarray
    alert_open: np.ndarray


def settled(timing: Timing, state: Gathered, enter: np.ndarray, holds_idle: np.ndarray,
            exit_: np.ndarray, now_ms: np.ndarray, top: int,
            cooldown_jitter_ms: np.ndarray | int = 0) -> np.ndarray:
    """Rows where ``decide`` (and the alert bookkeeping around it) would return the state
    unchanged and no decision. ``holds_idle``: the condition and the first stage's own
    condition; ``top``: the stages the compiled policy has conditions for;
    ``cooldown_jitter_ms``: each row's draw of the policy's ``jitter_s``. Conservative: a
    row it cannot vouch for is not settled, and goes through ``decide``."""
    pending = state.pending_since_ms != NONE_MS
    idle = (state.stage == 0) if not timing.one_shot else np.ones(now_ms.size, dtype=bool)
    # Idle: waiting for the condition, its ``for:`` timer running, or cooling down.
    timer_running = pending & (now_ms - state.pending_since_ms < timing.for_ms)
    cooling = ((state.last_fired_ms != NONE_MS)
               & (now_ms - state.last_fired_ms < timing.cooldown_ms + cooldown_jitter_ms))
    started = pending & (now_ms - state.pending_since_ms >= timing.for_ms)
    idle_holding = timer_running | (started & cooling & state.suppressed_audited)
    idle_clear = ~pending & ~state.suppressed_audited
    if timing.resolves_alerts:
        idle_clear &= ~(state.alert_open & ~enter)
    idle_settled = np.where(holds_idle, idle_holding, idle_clear)
    # Active: holding its stage (not due to climb), or inside the hysteresis band, or the
    # exit condition holding for less than ``hold_s``.
    clear = state.clear_since_ms == NONE_MS
    due = now_ms - state.stage_since_ms >= timing.stage_interval_ms
    holding = clear & (state.stage_since_ms != NONE_MS) & ~((state.stage < timing.stages) & due)
    leaving = ~clear & (now_ms - state.clear_since_ms < timing.hold_ms)
    active_settled = np.where(enter, holding, np.where(exit_, leaving, clear))
    out = np.where(idle, idle_settled, active_settled)
    return out & (state.stage <= top)


class StateColumns:
    """One policy's (one state key prefix's) states of every target slot."""

    def __init__(self, prefix: str, states: MutableMapping[str, PolicyState],
                 targets: list[str]) -> None:
        self.prefix = prefix
        self._states = states
        self._targets = targets
        self._times = {name: np.zeros(0, dtype=np.int64) for name in _FIELDS_MS}
        self._stage = np.zeros(0, dtype=np.int64)
        self._suppressed = np.zeros(0, dtype=bool)
        self._alert_open = np.zeros(0, dtype=bool)
        self.present = np.zeros(0, dtype=bool)
        self._loaded = np.zeros(0, dtype=bool)

    def forget_cached(self) -> None:
        self._loaded[:] = False

    def _grow(self, rows: int) -> None:
        size = self._stage.size
        if rows <= size:
            return
        extra = max(rows, 2 * size, 64) - size

        def grown(column: np.ndarray, fill: object) -> np.ndarray:
            return np.concatenate([column, np.full(extra, fill, dtype=column.dtype)])

        self._times = {name: grown(column, NONE_MS) for name, column in self._times.items()}
        self._stage = grown(self._stage, 0)
        self._suppressed = grown(self._suppressed, False)
        self._alert_open = grown(self._alert_open, False)
        self.present = grown(self.present, False)
        self._loaded = grown(self._loaded, False)

    def load(self, slots: np.ndarray) -> None:
        """Slots not read yet: their states from the mapping."""
        self._grow(len(self._targets))
        unread = slots[~self._loaded[slots]]
        if not unread.size:
            return
        unread = np.unique(unread)
        prefix, targets, states = self.prefix, self._targets, self._states
        found = [states.get(prefix + targets[slot]) for slot in unread.tolist()]
        # Most targets have no state yet (a fleet at first sight): theirs is set at once.
        held = np.fromiter((state is not None for state in found), dtype=bool,
                           count=unread.size)
        empty = unread[~held]
        for column in self._times.values():
            column[empty] = NONE_MS
        self._stage[empty] = 0
        self._suppressed[empty] = False
        self._alert_open[empty] = False
        self.present[empty] = False
        for slot, state in zip(unread[held].tolist(), (s for s in found if s is not None),
                               strict=True):
            self.put(slot, state)
        self._loaded[unread] = True

    def put(self, slot: int, state: PolicyState | None) -> None:
        """What the mapping now holds for the slot (None: nothing)."""
        self.present[slot] = state is not None
        state = state or PolicyState()
        for name, column in self._times.items():
            value = getattr(state, name)
            column[slot] = NONE_MS if value is None else value
        self._stage[slot] = state.stage
        self._suppressed[slot] = state.suppressed_audited
        self._alert_open[slot] = state.alert_open

    def gather(self, slots: np.ndarray) -> Gathered:
        return Gathered(*(self._times[name][slots] for name in _FIELDS_MS),
                        self._stage[slots], self._suppressed[slots], self._alert_open[slots])


class StateBoard:
    """The columns of every state key prefix the engine has met."""

    def __init__(self, states: MutableMapping[str, PolicyState], targets: list[str]) -> None:
        self._states = states
        self._targets = targets
        self._columns: dict[str, StateColumns] = {}

    def columns(self, prefix: str) -> StateColumns:
        columns = self._columns.get(prefix)
        if columns is None:
            columns = self._columns[prefix] = StateColumns(prefix, self._states, self._targets)
        return columns

    def forget_cached(self) -> None:
        for columns in self._columns.values():
            columns.forget_cached()

