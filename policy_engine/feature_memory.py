"""What a condition sees: each target's last known value of every feature, with its age.

A feature event carries the features its input batch updated (GPU samples in one, sync
samples in another). A feature an event does not carry keeps the value the target last
reported, and the event time it came with; a policy may bound the age it accepts
(``max_age_s``), past which the value counts as missing. Missing is not false: a
condition that cannot be told for want of a feature leaves the policy's state as it was.

The memory works on columns (a row per target, a column per feature name) and keeps a
mapping it is given up to date (a Faust table in the stream job, a dict offline): one
``KnownFeatures`` per target, written when the target is first seen or learns a feature
name, and otherwise once per ``persist_every_ms`` of its event time, shortened by up to
half by the target's slot (targets first seen together are then written in different
batches, not all in one). A restarted engine therefore starts from values at most
``persist_every_ms`` old, each with the time it was
reported, so a bound on age still holds. The mapping is read once per target, at first
sight or after ``forget_cached``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsec.policy_engine.feature_batch import FeatureBatch, TargetSlots
from dsec.schemas.units import ms_to_s, s_to_ms

__all__ = ["FeatureMemory", "FeatureView", "KnownFeatures"]

# A feature not reported for this long is forgotten, so a target that stopped reporting
# one does not carry it for ever.
FORGET_AFTER_MS = 24 * 3_600_000
PERSIST_EVERY_MS = 30_000
SWEEP_EVERY_MS = 3_600_000
_NEVER = -(1 << 62)  # no time: far below any event time, and safe to subtract from
_UNWRITTEN = -1  # the persisted name count of a target the mapping holds nothing for


@dataclass(slots=True, eq=False)
class KnownFeatures:
    """One target's last value of each feature and the event time (epoch ms) it came with,
    as three parallel sequences: what a row of the memory's columns gives, with no dict per
    target. ``of`` makes one from mappings; ``values`` and ``times_ms`` read it as mappings."""

    names: Sequence[str] = ()
    value_list: Sequence[float] | np.ndarray = ()
    time_list_ms: Sequence[int] | np.ndarray = ()

    @classmethod
    def of(cls, values: Mapping[str, float], times_ms: Mapping[str, int]) -> KnownFeatures:
        names = tuple(values)
        return cls(names, [values[name] for name in names], [times_ms[name] for name in names])

    @property
    def values(self) -> dict[str, float]:
        return dict(zip(self.names, _plain(self.value_list), strict=True))

    @property
    def times_ms(self) -> dict[str, int]:
        return dict(zip(self.names, _plain(self.time_list_ms), strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KnownFeatures):
            return NotImplemented
        return self.values == other.values and self.times_ms == other.times_ms

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "values": _plain(self.value_list),
                "times_ms": _plain(self.time_list_ms)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KnownFeatures:
        if set(data) == _JSON_KEYS and all(isinstance(data[key], list) for key in _JSON_KEYS):
            if not len(data["names"]) == len(data["values"]) == len(data["times_ms"]):
                raise ValueError("known features: names, values and times_ms differ in length")
            return cls(tuple(data["names"]), [float(value) for value in data["values"]],
                       [int(time_ms) for time_ms in data["times_ms"]])
        # The earlier form, still in tables written before: {name: [value, time_ms]}.
        return cls.of({name: float(pair[0]) for name, pair in data.items()},
                      {name: int(pair[1]) for name, pair in data.items()})


_JSON_KEYS = frozenset({"names", "values", "times_ms"})


def _plain(numbers: Sequence[float] | Sequence[int] | np.ndarray) -> list:
    return numbers.tolist() if isinstance(numbers, np.ndarray) else list(numbers)


@dataclass
class FeatureView:
    """A batch of events as the conditions see it, one row per event: ``values`` (NaN
    where the target never reported the feature), ``times_ms`` (when each value was
    reported) and ``fresh`` (the row's own event carried it)."""

    values: dict[str, np.ndarray]
    times_ms: dict[str, np.ndarray]
    fresh: dict[str, np.ndarray]
    event_times_ms: np.ndarray

    def subset(self, rows: np.ndarray) -> FeatureView:
        """The view of those rows alone."""
        return FeatureView({n: v[rows] for n, v in self.values.items()},
                           {n: t[rows] for n, t in self.times_ms.items()},
                           {n: f[rows] for n, f in self.fresh.items()}, self.event_times_ms[rows])

    def columns(self, names: Collection[str], max_age_s: float | None) -> dict[str, np.ndarray]:
        """The values of ``names``, those older than ``max_age_s`` (if given) made missing."""
        if max_age_s is None:
            return {name: self.values[name] for name in names}
        oldest_ms = self.event_times_ms - s_to_ms(max_age_s)
        return {name: np.where(self.times_ms[name] >= oldest_ms, self.values[name], np.nan)
                for name in names}

    def informed(self, names: Collection[str]) -> np.ndarray:
        """Rows whose event carried at least one of ``names``: the others say nothing new."""
        rows = self.event_times_ms.size
        out = np.zeros(rows, dtype=bool)
        for name in names:
            out |= self.fresh[name]
        return out

    def seen(self, row: int, names: Collection[str]) -> dict[str, tuple[float, float]]:
        """Row ``row``'s known values of ``names`` with their ages in seconds."""
        now_ms = int(self.event_times_ms[row])
        return {name: (float(self.values[name][row]),
                       ms_to_s(now_ms - int(self.times_ms[name][row])))
                for name in sorted(names) if self.values[name][row] == self.values[name][row]}


def occurrences(slots: np.ndarray, repeated: np.ndarray) -> list[np.ndarray]:
    """The rows in groups where no target repeats: each target's first row in the first
    group, its second in the second, and so on (rows in order within a group).
    ``repeated``: the rows whose target has other rows."""
    if not repeated.any():
        return [np.arange(slots.size)]
    seen: dict[int, int] = {}
    groups: list[list[int]] = []
    for row, slot in enumerate(slots.tolist()):
        nth = seen.get(slot, 0)
        seen[slot] = nth + 1
        if nth == len(groups):
            groups.append([])
        groups[nth].append(row)
    return [np.asarray(group, dtype=np.int64) for group in groups]


def repeated_rows(slots: np.ndarray) -> np.ndarray:
    """Rows whose slot occurs more than once."""
    if not slots.size:
        return np.zeros(0, dtype=bool)
    return np.bincount(slots)[slots] > 1


class FeatureMemory:
    def __init__(self, known: MutableMapping[str, KnownFeatures],
                 slots: TargetSlots | None = None,
                 persist_every_ms: int = PERSIST_EVERY_MS) -> None:
        self.known = known
        self.slots = slots if slots is not None else TargetSlots()
        self.persist_every_ms = persist_every_ms
        # A column per feature name, a row per target slot.
        self._values: dict[str, np.ndarray] = {}
        self._times: dict[str, np.ndarray] = {}
        self._rows = 0
        self._loaded = np.zeros(0, dtype=bool)
        # Per slot: how many names it knows, and the newest time among them.
        self._count = np.zeros(0, dtype=np.int64)
        self._latest_ms = np.zeros(0, dtype=np.int64)
        self._persisted_ms = np.zeros(0, dtype=np.int64)
        self._persisted_count = np.zeros(0, dtype=np.int64)
        self._swept_ms: int | None = None

    def forget_cached(self) -> None:
        """Read every target's features from the mapping again at its next event (another
        process may have written them meanwhile)."""
        self._loaded[:] = False

    def _grow(self, rows: int, names: Iterable[str]) -> None:
        if rows > self._rows:
            size = max(rows, 2 * self._rows, 64)
            extra = size - self._rows

            def grown(column: np.ndarray, fill: object) -> np.ndarray:
                return np.concatenate([column, np.full(extra, fill, dtype=column.dtype)])

            self._values = {n: grown(c, np.nan) for n, c in self._values.items()}
            self._times = {n: grown(c, _NEVER) for n, c in self._times.items()}
            self._loaded = grown(self._loaded, False)
            self._count = grown(self._count, 0)
            self._latest_ms = grown(self._latest_ms, _NEVER)
            self._persisted_ms = grown(self._persisted_ms, _NEVER)
            self._persisted_count = grown(self._persisted_count, _UNWRITTEN)
            self._rows = size
        for name in names:
            if name not in self._values:
                self._values[name] = np.full(self._rows, np.nan)
                self._times[name] = np.full(self._rows, _NEVER, dtype=np.int64)

    def _load(self, slots: np.ndarray) -> None:
        """Targets not read yet: their features from the mapping."""
        unread = slots[~self._loaded[slots]]
        if not unread.size:
            return
        unread = np.unique(unread)
        targets = self.slots.targets
        found = [self.known.get(targets[slot]) for slot in unread.tolist()]
        for name, column in self._values.items():
            column[unread] = np.nan
            self._times[name][unread] = _NEVER
        for column, fill in ((self._count, 0), (self._persisted_count, _UNWRITTEN),
                             (self._latest_ms, _NEVER), (self._persisted_ms, _NEVER)):
            column[unread] = fill
        stored = np.fromiter((before is not None for before in found), dtype=bool,
                             count=len(found))
        self._persisted_count[unread[stored]] = 0  # a record, if one with no names
        self._loaded[unread] = True
        # Records that know the same names (the usual case) are read a matrix at a time.
        groups: dict[tuple[str, ...], list[tuple[int, KnownFeatures]]] = {}
        for index, before in enumerate(found):
            if before is not None and before.names:
                groups.setdefault(tuple(before.names), []).append((index, before))
        for names, records in groups.items():
            self._grow(0, names)
            at = unread[[index for index, _ in records]]
            shape = (len(records), len(names))
            values = np.array([record.value_list for _, record in records],
                              dtype=np.float64).reshape(shape)
            times = np.array([record.time_list_ms for _, record in records],
                             dtype=np.int64).reshape(shape)
            for column, name in enumerate(names):
                self._values[name][at] = values[:, column]
                self._times[name][at] = times[:, column]
            self._latest_ms[at] = self._persisted_ms[at] = times.max(axis=1)
            self._count[at] = self._persisted_count[at] = len(names)

    def view(self, batch: FeatureBatch, names: Collection[str],
             slots: np.ndarray | None = None,
             repeated: np.ndarray | None = None) -> FeatureView:
        """Merges the batch (in order) into the memory and gives its view of ``names``:
        each row sees its target's values as of its own event. ``slots``: the batch's
        target slots, and ``repeated`` the rows whose target has others, when the caller
        has them."""
        if slots is None:
            slots = self.slots.slots(batch.targets)
        if repeated is None:
            repeated = repeated_rows(slots)
        rows = len(batch)
        ordered = list(names)
        self._grow(len(self.slots), [*batch.features, *ordered])
        self._load(slots)
        when = batch.event_times_ms
        values = {name: np.empty(rows) for name in ordered}
        times_ms = {name: np.empty(rows, dtype=np.int64) for name in ordered}
        carried = {name: column == column for name, column in batch.features.items()}
        for group in occurrences(slots, repeated):
            whole = group.size == rows
            at = slots if whole else slots[group]
            group_ms = when if whole else when[group]
            count = self._count[at]
            updated = np.zeros(at.size, dtype=bool)
            for name, column in batch.features.items():
                held_values, held_times = self._values[name], self._times[name]
                before_ms = held_times[at]
                # An event older than the value held (out of order) does not replace it.
                take = carried[name] if whole else carried[name][group]
                take = take & (before_ms <= group_ms)
                count += take & (before_ms == _NEVER)  # a name the target did not know
                updated |= take
                if take.all():
                    held_values[at] = column if whole else column[group]
                    held_times[at] = group_ms
                    if whole and name in values:  # each row's view: its own event's
                        values[name], times_ms[name] = column, when
                else:
                    held_values[at[take]] = (column if whole else column[group])[take]
                    held_times[at[take]] = group_ms[take]
            self._count[at] = count
            self._latest_ms[at] = np.maximum(self._latest_ms[at],
                                             np.where(updated, group_ms, _NEVER))
            for name in ordered:
                if whole and values[name] is batch.features.get(name):
                    continue
                values[name][group] = self._values[name][at]
                times_ms[name][group] = self._times[name][at]
        fresh = {name: carried[name] if name in carried else np.zeros(rows, dtype=bool)
                 for name in ordered}
        self._keep(np.unique(slots) if repeated.any() else slots, int(when.max()))
        return FeatureView(values, times_ms, fresh, when)

    def _keep(self, touched: np.ndarray, newest_ms: int) -> None:
        """Forget what targets have not reported for a day (every target swept once an
        hour of event time), and write the touched targets that are due to the mapping."""
        if self._swept_ms is None or newest_ms - self._swept_ms >= SWEEP_EVERY_MS:
            self._swept_ms = newest_ms
            self._forget_stale(np.flatnonzero(self._loaded))
        count = self._count[touched]
        latest_ms = self._latest_ms[touched]
        # Each slot's interval is shortened by up to half, by its number, so that targets
        # first seen together are not all written in the same batch ever after.
        interval_ms = self.persist_every_ms - (touched % 16) * (self.persist_every_ms // 32)
        due = ((count != self._persisted_count[touched])  # new names, or never written
               | (latest_ms - self._persisted_ms[touched] >= interval_ms))
        if not due.any():
            return
        indices = np.flatnonzero(due)
        slots = touched[indices]
        targets = self.slots.targets
        known = {name: column[slots] == column[slots] for name, column in self._values.items()}
        names = [name for name, is_known in known.items() if is_known.any()]
        if not names:
            for slot in slots.tolist():
                self.known[targets[slot]] = KnownFeatures()
        elif (pattern := np.column_stack([known[name] for name in names])).all():
            # The usual case: every due target knows the same names.
            # Each record holds its rows of two matrices: no number is made a Python object.
            shared = tuple(names)
            values = np.column_stack([self._values[name][slots] for name in names])
            times = np.column_stack([self._times[name][slots] for name in names])
            for slot, row_values, row_times in zip(slots.tolist(), values, times, strict=True):
                self.known[targets[slot]] = KnownFeatures(shared, row_values, row_times)
        else:
            rows = pattern.tolist()
            for i, slot in enumerate(slots.tolist()):
                held = tuple(name for name, is_known in zip(names, rows[i], strict=True)
                             if is_known)
                self.known[targets[slot]] = KnownFeatures(
                    held, [float(self._values[name][slot]) for name in held],
                    [int(self._times[name][slot]) for name in held])
        self._persisted_ms[slots] = latest_ms[indices]
        self._persisted_count[slots] = count[indices]

    def _forget_stale(self, touched: np.ndarray) -> None:
        latest_ms = self._latest_ms[touched]
        count = self._count[touched]
        for name, column in self._values.items():
            times = self._times[name]
            held_ms = times[touched]
            stale = (held_ms != _NEVER) & (held_ms < latest_ms - FORGET_AFTER_MS)
            count -= stale
            column[touched[stale]] = np.nan
            times[touched[stale]] = _NEVER
        self._count[touched] = count
