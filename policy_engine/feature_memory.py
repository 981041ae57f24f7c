"""What a condition sees: each target's last known value of every feature, with its age.

A feature event carries the features its input batch updated (GPU samples in one, sync
samples in another). A feature an event does not carry keeps the value the target last
reported, and the event time it came with; a policy may bound the age it accepts
(``max_age_s``), past which the value counts as missing. Missing is not false: a
condition that cannot be told for want of a feature leaves the policy's state as it was.

The memory is a mapping it is given (a Faust table in the stream job, a dict offline),
one ``KnownFeatures`` per target, written once per target per batch.
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsec.schemas import FeatureEvent
from dsec.schemas.units import ms_to_s, s_to_ms

__all__ = ["FeatureMemory", "FeatureView", "KnownFeatures"]

# A feature not reported for this long is forgotten, so a target that stopped reporting
# one does not carry it for ever.
FORGET_AFTER_MS = 24 * 3_600_000


@dataclass(frozen=True)
class KnownFeatures:
    """One target's last value of each feature and the event time (epoch ms) it came with."""

    values: dict[str, float] = field(default_factory=dict)
    times_ms: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {name: [value, self.times_ms[name]] for name, value in self.values.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KnownFeatures:
        return cls(values={name: float(pair[0]) for name, pair in data.items()},
                   times_ms={name: int(pair[1]) for name, pair in data.items()})


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


class FeatureMemory:
    def __init__(self, known: MutableMapping[str, KnownFeatures]) -> None:
        self.known = known

    def view(self, events: Sequence[FeatureEvent], targets: Sequence[str],
             names: Collection[str]) -> FeatureView:
        """Merges ``events`` (in order) into the memory and gives the batch's view of
        ``names``: each row sees its target's values as of its own event."""
        rows = len(events)
        ordered = list(names)
        # Row-major Python lists, one array per kind at the end: setting numpy elements one
        # by one costs several times a list's append.
        row_values: list[list[float]] = []
        row_times: list[list[int]] = []
        row_fresh: list[list[bool]] = []
        current: dict[str, tuple[dict[str, float], dict[str, int]]] = {}
        nan = float("nan")
        for event, target in zip(events, targets, strict=True):
            entry = current.get(target)
            if entry is None:
                before = self.known.get(target) or KnownFeatures()
                entry = current[target] = (dict(before.values), dict(before.times_ms))
            known_values, known_times = entry
            when = event.event_time_ms
            features = event.features
            for name, value in features.items():
                # An event older than the value held (out of order) does not replace it.
                if known_times.get(name, when) <= when:
                    known_values[name] = value
                    known_times[name] = when
            row_values.append([known_values.get(name, nan) for name in ordered])
            row_times.append([known_times.get(name, 0) for name in ordered])
            # a feature the event carries is known, so fresh implies a value
            row_fresh.append([name in features for name in ordered])
        for target, (known_values, known_times) in current.items():
            newest_ms = max(known_times.values(), default=0)
            if all(newest_ms - when <= FORGET_AFTER_MS for when in known_times.values()):
                self.known[target] = KnownFeatures(known_values, known_times)
                continue
            kept = [name for name, when in known_times.items()
                    if newest_ms - when <= FORGET_AFTER_MS]
            self.known[target] = KnownFeatures({name: known_values[name] for name in kept},
                                               {name: known_times[name] for name in kept})
        shape = (rows, len(ordered))
        value_matrix = np.array(row_values, dtype=np.float64).reshape(shape)
        time_matrix = np.array(row_times, dtype=np.int64).reshape(shape)
        fresh_matrix = np.array(row_fresh, dtype=bool).reshape(shape)
        values = {name: np.ascontiguousarray(value_matrix[:, j]) for j, name in enumerate(ordered)}
        times_ms = {name: np.ascontiguousarray(time_matrix[:, j])
                    for j, name in enumerate(ordered)}
        fresh = {name: np.ascontiguousarray(fresh_matrix[:, j]) for j, name in enumerate(ordered)}
        event_times = np.fromiter((e.event_time_ms for e in events), np.int64, rows)
        return FeatureView(values, times_ms, fresh, event_times)
