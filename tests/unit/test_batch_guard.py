"""A stream job's batch is acknowledged only with an outcome: delivered (tried again until
it is), or dead-lettered with the reason when the job fails on it."""

from __future__ import annotations

import asyncio

from dsec.infra.batch_guard import BatchGuard, DeliveryError
from dsec.infra.records import Output, Record
from dsec.schemas import DeadLetter, WorkerIdentity
from dsec.schemas.features import FeatureEvent

RECORDS = [Record("p.metrics.v1", 1, 40 + i, b"w", f'{{"n": {i}}}'.encode()) for i in range(3)]


def _output(n: int) -> Output:
    return Output("p.features.v1", b"w", FeatureEvent(
        identity=WorkerIdentity(job_id="j", worker_id="w", node_id="n"), event_time_ms=n,
        features={"n": float(n)}))


class Broker:
    """Takes what is sent; the first ``refuse`` sends are refused by the producer and the
    next ``lose`` are not delivered."""

    def __init__(self, refuse: int = 0, lose: int = 0) -> None:
        self.refuse, self.lose = refuse, lose
        self.delivered: list[Output] = []

    async def send(self, output: Output) -> asyncio.Future:
        if self.refuse:
            self.refuse -= 1
            raise DeliveryError("topic not authorized")
        future = asyncio.get_running_loop().create_future()
        if self.lose:
            self.lose -= 1
            future.set_exception(TimeoutError("no ack"))
        else:
            self.delivered.append(output)
            future.set_result(None)
        return future


def _guard(broker: Broker, waits: list[float], lettered: list[int] | None = None,
           **changes: float) -> BatchGuard:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    return BatchGuard("metrics-job", broker.send, "p.dead-letters.v1",
                      (lettered if lettered is not None else []).append, sleep=sleep, **changes)


def test_a_batch_not_delivered_is_handled_again_until_it_is() -> None:
    broker, waits, runs = Broker(refuse=3, lose=1), [], []

    async def handle(records: list[Record]) -> None:
        runs.append(len(records))
        await guard.deliver([_output(n) for n in range(len(records))])

    guard = _guard(broker, waits, max_wait_s=2.0)
    assert asyncio.run(guard.run(RECORDS, handle)) is True
    # deliver tries its outputs again itself: the handling ran once
    assert runs == [3]
    assert waits == [0.5, 1.0, 2.0, 2.0]  # doubled, up to max_wait_s
    assert [o.event.event_time_ms for o in broker.delivered][-3:] == [0, 1, 2]


def test_a_failed_delivery_inside_the_handling_runs_the_handling_again() -> None:
    broker, waits, runs = Broker(lose=1), [], []

    async def handle(records: list[Record]) -> None:
        runs.append(len(records))
        future = await broker.send(_output(len(runs)))
        try:
            await future
        except TimeoutError as exc:
            raise DeliveryError(repr(exc)) from exc

    assert asyncio.run(_guard(broker, waits).run(RECORDS, handle)) is True
    assert runs == [3, 3]
    assert waits == [0.5]


def test_a_batch_the_job_fails_on_is_dead_lettered_with_the_reason() -> None:
    broker, waits, lettered = Broker(refuse=1), [], []

    async def handle(records: list[Record]) -> None:
        raise ValueError("a feature out of range")

    assert asyncio.run(_guard(broker, waits, lettered).run(RECORDS, handle)) is False
    letters = [o.event for o in broker.delivered]
    assert all(isinstance(letter, DeadLetter) for letter in letters)
    assert [(d.source_topic, d.partition, d.offset, d.payload) for d in letters] == [
        (r.topic, r.partition, r.offset, r.value.decode()) for r in RECORDS]
    assert letters[0].reason == ("metrics-job could not handle this message's batch: "
                                 "ValueError: a feature out of range")
    assert {o.topic for o in broker.delivered} == {"p.dead-letters.v1"}
    assert lettered == [3]
    assert waits == [0.5]  # the dead letters' delivery, tried again


def test_processed_runs_once_and_dead_letters_a_failure() -> None:
    broker, waits, lettered = Broker(), [], []
    guard = _guard(broker, waits, lettered)
    assert asyncio.run(guard.processed(RECORDS, len)) == 3

    def fails(records: list[Record]) -> int:
        raise KeyError("pool")

    assert asyncio.run(guard.processed(RECORDS, fails)) is None
    assert lettered == [3]
    assert "KeyError: 'pool'" in broker.delivered[0].event.reason


def test_in_order_delivery_sends_a_topic_only_once_the_one_before_is_delivered() -> None:
    broker, waits = Broker(lose=1), []
    audits = [Output("p.policy-decisions.v1", b"w", _output(n).event) for n in (3, 4)]
    outputs = [_output(n) for n in range(3)] + audits
    asyncio.run(_guard(broker, waits).deliver(outputs, in_order=True))
    # the first command was lost: its run went out together, but the audit records only
    # after every command of the run was delivered, when all were sent again in order
    assert [(o.topic[2:10], o.event.event_time_ms) for o in broker.delivered] == [
        ("features", 1), ("features", 2), ("features", 0), ("features", 1), ("features", 2),
        ("policy-d", 3), ("policy-d", 4)]
    assert len(waits) == 1
