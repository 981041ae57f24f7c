"""The card job: which workers share a GPU card, and a degraded card's news to each of them.

When a card throttles, every process on it slows, but often only one of them samples it
through NVML. Reports arrive keyed by the card's UUID (``CardReport``, from the metrics
job), so one card's reports meet here whichever stream-job process holds the card. The
job keeps each card's members and the readings of those that sample it; when the card
turns degraded or well again, each member gets a feature event (``card_thermal_throttled``,
``card_workers``) on the features topic, keyed by the worker, as its other features are.
A member that joins a degraded card is told at once.

No broker here: records in, outputs and card states out, over the mapping of card states
it is given (a Faust table in the stream job, a dict in tests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from dsec.infra.records import Output, Record
from dsec.schemas import DecodeError, FeatureEvent, WorkerIdentity, decode, now_ms
from dsec.schemas.cards import CardReport
from dsec.schemas.topics import TopicNames
from dsec.schemas.units import s_to_ms
from dsec.stream_jobs.metrics_job import derived_event_id

__all__ = ["CARD_WINDOW", "CardJob", "CardMember", "CardState", "card_state_table"]

log = logging.getLogger(__name__)
CARD_WINDOW = "card"


@dataclass(frozen=True)
class CardMember:
    identity: WorkerIdentity
    last_seen_ms: int
    reports_card: bool = False
    throttled: bool = False


@dataclass(frozen=True)
class CardState:
    """``told_throttled``: what the members were last told (None: nothing yet)."""

    members: dict[str, CardMember] = field(default_factory=dict)
    told_throttled: bool | None = None

    @property
    def throttled(self) -> bool:
        return any(m.reports_card and m.throttled for m in self.members.values())

    def to_json(self) -> dict[str, Any]:
        return {"told_throttled": self.told_throttled, "members": {
            worker: {"identity": m.identity.model_dump(), "last_seen_ms": m.last_seen_ms,
                     "reports_card": m.reports_card, "throttled": m.throttled}
            for worker, m in self.members.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CardState:
        return cls(told_throttled=data.get("told_throttled"), members={
            worker: CardMember(identity=WorkerIdentity.model_validate(m["identity"]),
                               last_seen_ms=m["last_seen_ms"], reports_card=m["reports_card"],
                               throttled=m["throttled"])
            for worker, m in data.get("members", {}).items()})


class _CardStateTable(MutableMapping[str, CardState]):
    """Card states by UUID over a table of bytes keyed by the UUID's bytes (as on the
    gpu-cards topic)."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table

    def __getitem__(self, uuid: str) -> CardState:
        return CardState.from_json(orjson.loads(self._table[uuid.encode()]))

    def __setitem__(self, uuid: str, state: CardState) -> None:
        self._table[uuid.encode()] = orjson.dumps(state.to_json())

    def __delitem__(self, uuid: str) -> None:
        del self._table[uuid.encode()]

    def __iter__(self):
        return (key.decode() for key in list(self._table))

    def __len__(self) -> int:
        return len(self._table)


def card_state_table(table: MutableMapping[bytes, bytes]) -> MutableMapping[str, CardState]:
    return _CardStateTable(table)


@dataclass
class CardCounters:
    reports_in: int = 0
    features_out: int = 0
    dead_letters: int = 0


class CardJob:
    def __init__(self, topics: TopicNames, states: MutableMapping[str, CardState],
                 member_ttl_s: float = 90.0, clock_ms: Callable[[], int] = now_ms) -> None:
        """``member_ttl_s``: a member not heard of for this long has left the card (the
        metrics job repeats its reports every 30 s)."""
        self.topics = topics
        self.states = states
        self.member_ttl_ms = s_to_ms(member_ttl_s)
        self.clock_ms = clock_ms
        self.counters = CardCounters()

    def process(self, records: Iterable[Record]) -> tuple[list[Output], dict[str, CardState]]:
        """The outputs to publish, then the card states to keep once they are out."""
        outputs: list[Output] = []
        states: dict[str, CardState] = {}
        for record in records:
            try:
                report = decode(record.value, CardReport)
            except DecodeError as exc:
                self.counters.dead_letters += 1
                outputs.append(Output(self.topics.dead_letters, record.topic.encode(),
                                      record.dead_letter(exc.reason)))
                continue
            self.counters.reports_in += 1
            uuid = report.gpu_uuid
            before = states.get(uuid) or self.states.get(uuid) or CardState()
            after, told = self._add(before, report, record)
            states[uuid] = after
            outputs += told
        self.counters.features_out += sum(o.topic == self.topics.features for o in outputs)
        return outputs, states

    def save(self, states: dict[str, CardState]) -> None:
        for uuid, state in states.items():
            self.states[uuid] = state

    def _add(self, state: CardState, report: CardReport,
             record: Record) -> tuple[CardState, list[Output]]:
        worker = report.identity.worker_id
        seen_ms = report.event_time_ms
        members = {w: m for w, m in state.members.items()
                   if seen_ms - m.last_seen_ms <= self.member_ttl_ms}
        joined = worker not in members
        members[worker] = CardMember(report.identity, seen_ms, report.reports_card,
                                     report.throttled)
        after = replace(state, members=members)
        throttled = after.throttled
        changed = state.told_throttled is not None and throttled != state.told_throttled
        after = replace(after, told_throttled=throttled)
        if changed:
            log.warning("card %s %s: telling its %d workers", report.gpu_uuid,
                        "throttles" if throttled else "recovered", len(members))
            told = list(members.values())
        elif joined:  # a new member learns the card's state at once
            told = [members[worker]]
        else:
            told = []
        return after, [self._tell(report.gpu_uuid, m, throttled, len(members), record)
                       for m in told]

    def _tell(self, uuid: str, member: CardMember, throttled: bool, workers: int,
              record: Record) -> Output:
        event = FeatureEvent(
            event_id=derived_event_id("card", uuid, member.identity.worker_id,
                                      record.partition, record.offset),
            event_time_ms=self.clock_ms(), identity=member.identity, gpu_uuid=uuid,
            window=CARD_WINDOW,
            features={"card_thermal_throttled": float(throttled),
                      "card_workers": float(workers)})
        return Output(self.topics.features, member.identity.worker_id.encode(), event)
