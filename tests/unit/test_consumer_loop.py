"""The ConsumerLoop's control flow on an in-memory double of the client API: offsets move
only after the writer made a batch durable, no message ends the loop, a bounded read stops
at the end. The same guarantees on the real broker: tests/integration/
test_consumer_loop_kafka.py."""

from __future__ import annotations

import threading

import pytest
from consumer_double import InMemoryLog

from dsec.infra.consumer_loop import (
    BatchWriter,
    ConsumerLoop,
    ConsumerLoopConfig,
    FailedMessages,
    OutputUnavailable,
    Start,
    TopicMissing,
    consumer_lag,
)
from dsec.infra.observability import ProcessMetrics

SAFETY_S = 60.0  # never reached: every loop here ends by itself


class ListWriter(BatchWriter[list]):
    """Keeps the values written; raises on ``poison``; stops the loop after ``stop_after``."""

    def __init__(self, stop_after: int | None = None, unavailable_at: int | None = None):
        self.written: list[bytes | None] = []
        self.batches: list[int] = []
        self.loop: ConsumerLoop | None = None
        self._stop_after = stop_after
        self._unavailable_at = unavailable_at

    def write(self, batch: list) -> None:
        values = [message.value() for message in batch]
        if b"poison" in values:
            raise ValueError("cannot handle poison")
        if self._unavailable_at is not None and len(self.written) + len(values) > \
                self._unavailable_at:
            raise OutputUnavailable("the store went away")
        self.written += values
        self.batches.append(len(values))
        if self._stop_after is not None and len(self.written) >= self._stop_after:
            assert self.loop is not None
            self.loop.stop()


def _loop(log: InMemoryLog, writer: ListWriter, letters: list | None = None,
          **config) -> ConsumerLoop:
    dead = letters if letters is not None else []
    loop = ConsumerLoop(
        ConsumerLoopConfig(**{"topics": ("t",), "group_id": "g", **config}), {}, writer,
        lambda message, reason: dead.append((message.offset(), reason)), service="test",
        consumer_factory=log.consumer)
    writer.loop = loop
    return loop


def _log(values: list[bytes], partitions: int = 1) -> InMemoryLog:
    log = InMemoryLog()
    for n, value in enumerate(values):
        log.append("t", value, partition=n % partitions, partitions=partitions)
    return log


@pytest.mark.parametrize("overlap", [False, True])
def test_offsets_are_committed_after_the_write(overlap: bool) -> None:
    log = _log([b"%d" % n for n in range(10)])
    writer = ListWriter(stop_after=10)
    loop = _loop(log, writer, batch_max_messages=4, overlap_writes=overlap)
    assert loop.run(timeout_s=SAFETY_S)
    assert writer.written == [b"%d" % n for n in range(10)]
    assert log.committed[("g", "t", 0)] == 10
    # Every commit covers batches written only: never ahead of the writer.
    assert [c[("t", 0)] for c in log.commits] == sorted(c[("t", 0)] for c in log.commits)
    assert loop.stats.messages == 10 and loop.stats.dead_lettered == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_output_unavailable_ends_the_loop_and_the_batch_is_read_again(overlap: bool) -> None:
    log = _log([b"%d" % n for n in range(10)])
    letters: list = []
    writer = ListWriter(unavailable_at=6)
    with pytest.raises(OutputUnavailable):
        _loop(log, writer, letters, batch_max_messages=4, overlap_writes=overlap).run(
            timeout_s=SAFETY_S)
    assert writer.written == [b"0", b"1", b"2", b"3"] and letters == []
    assert log.committed[("g", "t", 0)] == 4
    again = ListWriter(stop_after=6)
    assert _loop(log, again, batch_max_messages=4).run(timeout_s=SAFETY_S)
    assert again.written == [b"%d" % n for n in range(4, 10)]
    assert log.committed[("g", "t", 0)] == 10


@pytest.mark.parametrize("overlap", [False, True])
def test_a_poison_message_is_dead_lettered_and_the_loop_goes_on(overlap: bool) -> None:
    values = [b"a", b"b", b"poison", b"c", b"d", b"e"]
    log = _log(values)
    letters: list = []
    metrics = ProcessMetrics()
    writer = ListWriter(stop_after=5)
    loop = ConsumerLoop(
        ConsumerLoopConfig(("t",), "g", batch_max_messages=4, overlap_writes=overlap), {},
        writer, lambda message, reason: letters.append((message.offset(), reason)),
        service="test", metrics=metrics, consumer_factory=log.consumer)
    writer.loop = loop
    assert loop.run(timeout_s=SAFETY_S)
    assert writer.written == [b"a", b"b", b"c", b"d", b"e"]
    assert len(letters) == 1 and letters[0][0] == 2
    assert "ValueError: cannot handle poison" in letters[0][1]
    assert loop.stats.dead_lettered == 1
    assert metrics.registry.get_sample_value(
        "dsec_events_dead_lettered_total", {"service": "test", "reason": "handler_failed"}) == 1
    assert log.committed[("g", "t", 0)] == 6


def test_a_failing_dead_letter_ends_the_loop_with_the_batch_uncommitted() -> None:
    log = _log([b"a", b"poison", b"b"])

    def dead_letter(_message, _reason) -> None:
        raise RuntimeError("the dead-letter topic is gone")

    loop = ConsumerLoop(ConsumerLoopConfig(("t",), "g"), {}, ListWriter(), dead_letter,
                        service="test", consumer_factory=log.consumer)
    with pytest.raises(RuntimeError, match="dead-letter topic"):
        loop.run(timeout_s=SAFETY_S)
    assert ("g", "t", 0) not in log.committed


def test_prepare_failure_is_guarded_per_message() -> None:
    class Preparing(ListWriter):
        def prepare(self, messages):
            if any(m.value() == b"bad" for m in messages):
                raise KeyError("bad")
            return list(messages)

    log = _log([b"a", b"bad", b"b"])
    letters: list = []
    writer = Preparing(stop_after=2)
    for overlap in (False, True):
        letters.clear()
        writer.written.clear()
        log.committed.clear()
        assert _loop(log, writer, letters, overlap_writes=overlap).run(timeout_s=SAFETY_S)
        assert writer.written == [b"a", b"b"] and [o for o, _ in letters] == [1]


class EachOnce(ListWriter):
    """Handles each message on its own, as a writer with effects that must not be repeated:
    the poison ones are named in ``FailedMessages``."""

    def __init__(self, stop_after: int) -> None:
        super().__init__(stop_after=stop_after)
        self.handled: list[bytes | None] = []

    def write(self, batch: list) -> None:
        failures = []
        for message in batch:
            self.handled.append(message.value())
            if message.value() == b"poison":
                failures.append((message, "ValueError: cannot handle poison"))
            else:
                super().write([message])
        if failures:
            raise FailedMessages(failures)


@pytest.mark.parametrize("overlap", [False, True])
def test_failed_messages_are_dead_lettered_and_the_rest_is_not_handled_again(
        overlap: bool) -> None:
    log = _log([b"a", b"poison", b"b", b"poison", b"c", b"d"])
    letters: list = []
    writer = EachOnce(stop_after=4)
    loop = _loop(log, writer, letters, batch_max_messages=4, overlap_writes=overlap)
    assert loop.run(timeout_s=SAFETY_S)
    assert writer.handled == [b"a", b"poison", b"b", b"poison", b"c", b"d"]
    assert writer.written == [b"a", b"b", b"c", b"d"]
    assert [offset for offset, _ in letters] == [1, 3]
    assert all("cannot handle poison" in reason for _, reason in letters)
    assert loop.stats.dead_lettered == 2 and log.committed[("g", "t", 0)] == 6


def test_an_assigned_loop_from_the_end_reads_only_what_comes_after_assignment() -> None:
    log = _log([b"old-0", b"old-1"], partitions=2)
    writer = ListWriter(stop_after=2)
    loop = _loop(log, writer, assign=True, start=Start.END, commit=False,
                 return_on_first=True)
    assert not loop.wait_assigned(0)
    runner = threading.Thread(target=loop.run, kwargs={"timeout_s": SAFETY_S})
    runner.start()
    assert loop.wait_assigned(SAFETY_S)
    log.append("t", b"new-0", partition=0, partitions=2)
    log.append("t", b"new-1", partition=1, partitions=2)
    runner.join(SAFETY_S)
    assert sorted(writer.written) == [b"new-0", b"new-1"] and log.commits == []


def test_a_new_group_that_resets_to_latest_reads_what_comes_after_assignment() -> None:
    """A group without committed offsets and ``auto.offset.reset=latest`` starts where the
    partitions ended when it took them (read then, not at the client's first fetch), and
    a partition the group committed resumes there."""
    log = _log([b"old-0", b"old-1", b"old-2", b"old-3"], partitions=2)
    log.committed[("g", "t", 1)] = 1  # resumes at old-3
    writer = ListWriter(stop_after=3)
    loop = ConsumerLoop(
        ConsumerLoopConfig(("t",), "g", return_on_first=True), {"auto.offset.reset": "latest"},
        writer, lambda message, reason: None, service="test", consumer_factory=log.consumer)
    writer.loop = loop
    runner = threading.Thread(target=loop.run, kwargs={"timeout_s": SAFETY_S})
    runner.start()
    assert loop.wait_assigned(SAFETY_S)
    log.append("t", b"new-0", partition=0, partitions=2)
    log.append("t", b"new-1", partition=1, partitions=2)
    runner.join(SAFETY_S)
    assert sorted(writer.written) == [b"new-0", b"new-1", b"old-3"]


def test_a_round_ending_at_the_first_message_still_takes_what_was_fetched() -> None:
    log = _log([b"%d" % n for n in range(10)])
    writer = ListWriter(stop_after=10)
    loop = _loop(log, writer, batch_max_messages=4, return_on_first=True)
    assert loop.run(timeout_s=SAFETY_S)
    assert writer.written == [b"%d" % n for n in range(10)] and writer.batches == [4, 4, 2]


def test_a_bounded_read_stops_at_the_end_and_commits_nothing() -> None:
    log = _log([b"%d" % n for n in range(7)], partitions=3)
    log.topics["t"].append([])  # an empty partition is at its end at once
    writer = ListWriter()
    loop = _loop(log, writer, assign=True, until_end=True, commit=False,
                 start=Start.BEGINNING, batch_max_messages=2)
    assert loop.run(timeout_s=SAFETY_S)
    assert sorted(writer.written) == sorted(b"%d" % n for n in range(7))
    assert loop.end_offsets == {("t", 0): 3, ("t", 1): 2, ("t", 2): 2, ("t", 3): 0}
    assert log.commits == []


def test_an_assigned_loop_starts_where_it_is_told() -> None:
    log = _log([b"%d" % n for n in range(5)])
    log.committed[("g", "t", 0)] = 2
    writer = ListWriter()
    assert _loop(log, writer, assign=True, until_end=True).run(timeout_s=SAFETY_S)
    assert writer.written == [b"2", b"3", b"4"]
    told = ListWriter(stop_after=1)
    loop = ConsumerLoop(ConsumerLoopConfig(("t",), "g"), {}, told, lambda m, r: None,
                        service="test", consumer_factory=log.consumer,
                        starting_offsets=lambda partitions: {("t", 0): 4})
    told.loop = loop
    assert loop.run(timeout_s=SAFETY_S)
    assert told.written == [b"4"]


def test_an_assigned_loop_on_a_missing_topic_says_which() -> None:
    with pytest.raises(TopicMissing) as missing:
        _loop(InMemoryLog(), ListWriter(), assign=True).run(timeout_s=SAFETY_S)
    assert missing.value.topic == "t"


def test_lag_is_reported_per_partition_and_liveness_is_visible() -> None:
    log = _log([b"%d" % n for n in range(6)])
    metrics = ProcessMetrics()
    stop = threading.Event()
    writer = ListWriter(stop_after=4)
    loop = ConsumerLoop(ConsumerLoopConfig(("t",), "g", batch_max_messages=4), {}, writer,
                        lambda m, r: None, service="test", metrics=metrics, stop=stop,
                        consumer_factory=log.consumer)
    writer.loop = loop
    assert loop.down() == "test's consumer loop has not started yet"
    assert loop.run(timeout_s=SAFETY_S)
    assert loop.down() is None and stop.is_set()
    assert loop.lag_by_partition == {("t", 0): 2}
    assert metrics.registry.get_sample_value(
        "dsec_consumer_lag_messages", {"service": "test", "topic": "t", "partition": "0"}) == 2


def test_consumer_lag() -> None:
    assert consumer_lag(10, 4) == 6
    assert consumer_lag(10, 10) == 0
    assert consumer_lag(3, 5) == 0  # a cached end older than the position
    assert consumer_lag(-1001, 4) is None
    assert consumer_lag(10, -1001) is None


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        ConsumerLoopConfig((), "g")
    with pytest.raises(ValueError):
        ConsumerLoopConfig(("t",), "g", until_end=True)
    with pytest.raises(ValueError):
        ConsumerLoopConfig(("t",), "g", batch_max_messages=0)
