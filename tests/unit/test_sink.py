"""The ClickHouse sink, a ConsumerLoop and its writer, on the in-memory consumer double and
the real ClickHouse engine (chDB in a temporary folder): each batch is stored once and its
offsets recorded before they are committed, a new sink resumes after what was recorded, and
a batch whose write failed is stored by the next loop rather than skipped as seen. The
same sink on the real broker: tests/integration/test_sink_rejections_kafka.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from consumer_double import InMemoryLog, InMemoryMessage
from helpers import wait_for

from dsec.infra.consumer_loop import OutputUnavailable
from dsec.infra.observability import ProcessMetrics
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.recent_ids import RecentIds
from dsec.infra.store.sink import ClickHouseSink
from dsec.schemas import (
    DeadLetter,
    FeatureEvent,
    MetricBatch,
    StepSample,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
    topic_names,
)
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.feature_columns import pack_feature_events

TOPICS = topic_names("t")
GROUP = "sink"
DAY_MS = 86_400_000


class ListDeadLetters:
    """Dead letters kept in a list; the first ``failures`` publishes find no topic."""

    topic = TOPICS.dead_letters

    def __init__(self, failures: int = 0) -> None:
        self.letters: list[DeadLetter] = []
        self._failures = failures

    def publish(self, letters: Sequence[DeadLetter]) -> None:
        if self._failures:
            self._failures -= 1
            raise OutputUnavailable("the dead-letter topic is gone")
        self.letters += letters

    def close(self, timeout_s: float, release: bool = True) -> None:
        pass


@pytest.fixture
def client(tmp_path):
    client = connect(f"chdb://{tmp_path / 'ch'}")
    ensure_schema(client, ttl_days=365)  # the broken clock below is 160 days behind
    yield client
    client.close()


def _identity(worker_id: str) -> WorkerIdentity:
    return WorkerIdentity(job_id="job", node_id="node-a", worker_id=worker_id)


def _steps(worker_id: str, count: int = 20) -> MetricBatch:
    return MetricBatch(identity=_identity(worker_id), samples=[
        StepSample(event_time_ms=now_ms() + step, step=step) for step in range(count)])


def _feature(worker_id: str, n: int) -> FeatureEvent:
    return FeatureEvent(identity=_identity(worker_id), features={"reward_mean": float(n)})


def _sink(log: InMemoryLog, client, letters: ListDeadLetters,
          metrics: ProcessMetrics | None = None) -> ClickHouseSink:
    return ClickHouseSink(client, threading.Lock(), {"group.id": GROUP}, TOPICS, {},
                          metrics=metrics or ProcessMetrics(),
                          event_times=EventTimeWindow(ttl_days=365), restart_delay_s=0.01,
                          dead_letters=letters, consumer_factory=log.consumer)


def _run_until(sink: ClickHouseSink, done, what: str) -> None:
    sink.start()
    try:
        wait_for(done, 60, interval_s=0.05, what=what)
        sink.health()  # brings counters.loop_restarts up to date
    finally:
        sink.stop()


def _committed(log: InMemoryLog, topic: str) -> int:
    return log.committed.get((GROUP, topic, 0), 0)


def _scalar(client, sql: str) -> int:
    return int(client.query(sql).result_rows[0][0])


def _recorded(client) -> dict[str, int]:
    return dict(client.query("SELECT topic, max(next_offset) FROM sink_offsets "
                             "GROUP BY topic").result_rows)


def test_each_batch_is_stored_once_and_recorded_before_its_commit(client) -> None:
    log = InMemoryLog()
    batches = [_steps(f"w{n}") for n in range(3)]
    features = [_feature("w0", n) for n in range(5)]
    for value in [*map(encode, batches), encode(batches[0])]:  # the last one replayed
        log.append(TOPICS.metrics, value)
    for value in [*map(encode, features), encode(features[2])]:
        log.append(TOPICS.features, value)
    sink = _sink(log, client, ListDeadLetters())
    _run_until(sink, lambda: _committed(log, TOPICS.metrics) == 4
               and _committed(log, TOPICS.features) == 6, "the batches committed")

    assert _scalar(client, "SELECT count() FROM raw_step") == 60
    assert sink.counters.rows_by_table["raw_step"] == 60  # samples, by the view's name
    assert _scalar(client, "SELECT uniqExact(event_id) FROM features") == 5
    assert sink.counters.duplicates_skipped == 2 and sink.counters.samples == 60
    assert _recorded(client) == {TOPICS.metrics: 4, TOPICS.features: 6}


def test_a_new_sink_resumes_after_what_it_recorded(client) -> None:
    log = InMemoryLog()
    for n in range(3):
        log.append(TOPICS.features, encode(_feature("w0", n)))
    _run_until(_sink(log, client, ListDeadLetters()),
               lambda: _committed(log, TOPICS.features) == 3, "the first features")
    log.committed.clear()  # as if the sink died between its write and the commit
    log.append(TOPICS.features, encode(_feature("w0", 3)))
    again = _sink(log, client, ListDeadLetters())
    _run_until(again, lambda: _committed(log, TOPICS.features) == 4, "the new feature")
    assert again.counters.messages == 1 and again.counters.duplicates_skipped == 0
    assert _scalar(client, "SELECT count() FROM features") == 4


def test_a_batch_not_made_durable_is_stored_by_the_next_loop_once(client) -> None:
    log = InMemoryLog()
    start_ms = now_ms() - 160 * DAY_MS
    # A broken clock: its steps span 150 days, a message the store refuses (its samples
    # span more than a day); its dead letter finds no topic the first time.
    poisoned = MetricBatch(identity=_identity("broken-clock"), samples=[
        StepSample(event_time_ms=start_ms + day * DAY_MS, step=day) for day in range(150)])
    for batch in [_steps("h0"), poisoned, _steps("h1"), _steps("h2")]:
        log.append(TOPICS.metrics, encode(batch))
    letters = ListDeadLetters(failures=1)
    metrics = ProcessMetrics()
    sink = _sink(log, client, letters, metrics)
    _run_until(sink, lambda: _committed(log, TOPICS.metrics) == 4, "the batch stored")

    assert sink.counters.loop_restarts == 1  # the loop whose dead letter found no topic
    assert _scalar(client, "SELECT count() FROM raw_step WHERE worker_id LIKE 'h%'") == 60
    assert _scalar(client, "SELECT count() FROM raw_step WHERE worker_id = 'broken-clock'") == 0
    [letter] = letters.letters
    assert letter.source_topic == TOPICS.metrics and "samples_within_a_day" in letter.reason
    assert decode(letter.payload.encode(), MetricBatch).event_id == poisoned.event_id
    assert metrics.registry.get_sample_value(
        "dsec_events_dead_lettered_total", {"service": "sink", "reason": "store_rejected"}) == 1


def test_a_message_the_loop_dead_letters_is_published_and_recorded(client) -> None:
    letters = ListDeadLetters()
    sink = _sink(InMemoryLog(), client, letters)
    sink.writer.dead_letter(InMemoryMessage(TOPICS.features, 0, 7, b"{}"), "it broke")
    assert [(letter.offset, letter.reason) for letter in letters.letters] == [(7, "it broke")]
    assert _recorded(client) == {TOPICS.features: 8}
    assert sink.counters.unpreparable == 1


def test_health_says_why_the_loop_is_down() -> None:
    sink = ClickHouseSink(None, threading.Lock(), {"group.id": GROUP}, TOPICS, {},
                          dead_letters=ListDeadLetters(), consumer_factory=InMemoryLog().consumer)
    assert sink.health() == "the sink's consumer loop is not running"


def test_recent_ids_keep_what_was_stored_and_take_back_what_was_not() -> None:
    recent = RecentIds(capacity=2)
    assert recent.claim("features", "a") and not recent.claim("features", "a")
    assert recent.claim("raw", "a")  # scopes apart
    recent.release([("features", "a")])
    assert recent.claim("features", "a")
    recent.keep([("features", "a")])
    assert not recent.claim("features", "a")
    recent.seed("features", ["b", "c"])  # "a" is the oldest: forgotten
    assert recent.claim("features", "a") and not recent.claim("features", "c")
    recent.release_all()
    assert recent.claim("features", "a")


def test_columns_of_features_are_stored_a_row_per_event_each_once(client) -> None:
    log = InMemoryLog()
    features = [_feature(f"w{n}", n) for n in range(6)]
    log.append(TOPICS.features, encode(pack_feature_events(features[:4], "columns-1", 0)))
    # a replay packs the events otherwise: rows already stored are not stored again
    log.append(TOPICS.features, encode(pack_feature_events(features[2:], "columns-2", 0)))
    log.append(TOPICS.features, encode(features[5]))
    sink = _sink(log, client, ListDeadLetters())
    _run_until(sink, lambda: _committed(log, TOPICS.features) == 3, "the batches committed")

    assert _scalar(client, "SELECT uniqExact(event_id) FROM features") == 6
    assert _scalar(client, "SELECT count() FROM features") == sink.counters.rows_by_table[
        "features"]
    assert sink.counters.duplicates_skipped == 3


def test_a_message_whose_rows_the_store_refuses_is_dead_lettered_once(client) -> None:
    from dsec.infra.store.sink_batch import PreparedBatch, Source

    sink = _sink(InMemoryLog(), client, ListDeadLetters())
    batch = PreparedBatch()
    source = Source(TOPICS.features, 0, 7, b"{}")
    for reason in ("refused: row 1", "refused: row 2"):  # two rows of one message
        sink.writer._reject(batch, source, reason)
    sink.writer._reject(batch, Source(TOPICS.features, 0, 8, b"{}"), "refused: another")
    assert [(d.offset, d.reason) for d in batch.dead_letters] == [
        (7, "refused: row 1"), (8, "refused: another")]
    assert sink.counters.dead_lettered == 2
