"""The policy engine's state as table bytes: per (policy, target) ``PolicyState``s, per
(target, knob) ``KnobEntry``s and per target ``KnownFeatures``, each kept in a table of one
JSON object per worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

import orjson

from dsec.policy_engine.decide import PolicyState
from dsec.policy_engine.feature_memory import KnownFeatures
from dsec.policy_engine.knobs import KnobEntry

__all__ = [
    "WorkerKeyedTable", "feature_table", "knob_table", "state_table", "worker_of_knob",
    "worker_of_state", "worker_of_target",
]

V = TypeVar("V")


def worker_of_state(key: str) -> str:
    """The worker of a policy-state key, ``policy|job|worker``."""
    return key.split("|", 2)[2]


def worker_of_knob(key: str) -> str:
    """The worker of a knob key, ``job|worker|knob``."""
    return key.split("|", 2)[1]


def worker_of_target(key: str) -> str:
    """The worker of a target key, ``job|worker``."""
    return key.split("|", 1)[1]


class WorkerKeyedTable(MutableMapping[str, V], Generic[V]):
    """Entries keyed by strings that name their worker, kept in a table of one JSON object
    per worker, under the worker id's bytes: every write of an entry rewrites its worker's
    object. Keys and values are bytes in the table, as they come back on recovery; a worker
    with no entries has no object. Only the entry asked for is made from its JSON."""

    def __init__(self, table: MutableMapping[bytes, bytes], worker_of: Callable[[str], str],
                 to_json: Callable[[V], Any], from_json: Callable[[Any], V]) -> None:
        self._table = table
        self._worker_of = worker_of
        self._to_json = to_json
        self._from_json = from_json

    def _entries(self, worker: bytes) -> dict[str, Any]:
        raw = self._table.get(worker)
        return {} if raw is None else orjson.loads(raw)

    def _store(self, worker: bytes, entries: dict[str, Any]) -> None:
        if entries:
            self._table[worker] = orjson.dumps(entries)
        elif worker in self._table:
            del self._table[worker]

    def __getitem__(self, key: str) -> V:
        return self._from_json(self._entries(self._worker_of(key).encode())[key])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._entries(self._worker_of(key).encode())

    def __setitem__(self, key: str, value: V) -> None:
        worker = self._worker_of(key).encode()
        entries = self._entries(worker)
        entries[key] = self._to_json(value)
        self._store(worker, entries)

    def __delitem__(self, key: str) -> None:
        worker = self._worker_of(key).encode()
        entries = self._entries(worker)
        del entries[key]
        self._store(worker, entries)

    def __iter__(self) -> Iterator[str]:
        for worker in list(self._table):
            yield from self._entries(worker)

    def __len__(self) -> int:
        return sum(len(self._entries(worker)) for worker in list(self._table))

    def __bool__(self) -> bool:
        return len(self._table) > 0  # no worker keeps an empty object


def state_table(table: MutableMapping[bytes, bytes]) -> WorkerKeyedTable[PolicyState]:
    return WorkerKeyedTable(table, worker_of_state, PolicyState.to_json, PolicyState.from_json)


def knob_table(table: MutableMapping[bytes, bytes]) -> WorkerKeyedTable[KnobEntry]:
    return WorkerKeyedTable(table, worker_of_knob, KnobEntry.to_json, KnobEntry.from_json)


def feature_table(table: MutableMapping[bytes, bytes]) -> WorkerKeyedTable[KnownFeatures]:
    return WorkerKeyedTable(table, worker_of_target, KnownFeatures.to_json,
                            KnownFeatures.from_json)
