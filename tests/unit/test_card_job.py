"""Card-level fan-out, without a broker: the metrics job reports each worker's cards, the
card job tells every worker on a card when it turns degraded or well again."""

from __future__ import annotations

from dsec.infra.records import Record
from dsec.schemas import MetricBatch, MetricColumns, WorkerIdentity, encode, topic_names
from dsec.schemas.cards import CardReport
from dsec.schemas.metrics import CudaMemoryColumns, GpuColumns
from dsec.stream_jobs.card_job import CardJob, CardState, card_state_table
from dsec.stream_jobs.card_reports import card_news
from dsec.stream_jobs.metrics_job import MetricsJob
from dsec.stream_jobs.worker_state import CardSeen

TOPICS = topic_names("t")
GIB = 1 << 30
START_MS = 1_800_000_000_000


def _identity(worker: str) -> WorkerIdentity:
    return WorkerIdentity(job_id="job", worker_id=worker, node_id="n1")


def _batch(worker: str, second: int, card: str, samples_card: bool,
           throttle: int = 0) -> MetricBatch:
    t_ms = START_MS + second * 1000
    columns = MetricColumns(cuda_memory=CudaMemoryColumns(
        event_time_ms=[t_ms], device_index=[0], allocated_bytes=[GIB], reserved_bytes=[GIB]))
    if samples_card:
        columns = MetricColumns(cuda_memory=columns.cuda_memory, gpu=GpuColumns(
            event_time_ms=[t_ms], gpu_uuid=[card], memory_used_bytes=[3 * GIB],
            memory_total_bytes=[80 * GIB], throttle_reasons=[throttle]))
    return MetricBatch(event_id=f"{worker}-{second:06d}", event_time_ms=t_ms,
                       identity=_identity(worker), gpu_uuid=card, columns=columns)


def _metrics_records(batches: list[MetricBatch]) -> list[Record]:
    return [Record(TOPICS.metrics, 0, offset, b.identity.worker_id.encode(), encode(b))
            for offset, b in enumerate(batches)]


def _card_records(outputs) -> list[Record]:
    return [Record(TOPICS.gpu_cards, 0, offset, o.key, encode(o.event))
            for offset, o in enumerate(outputs) if o.topic == TOPICS.gpu_cards]


def _told(outputs) -> dict[str, float]:
    return {o.event.identity.worker_id: o.event.features["card_thermal_throttled"]
            for o in outputs if o.topic == TOPICS.features}


def test_a_throttling_card_is_told_to_every_worker_on_it() -> None:
    # w1 samples card A through NVML; w2 shares it and only names it; w3 is on card B.
    metrics = MetricsJob(TOPICS, {}, clock_ms=lambda: START_MS)
    cards = CardJob(TOPICS, {}, clock_ms=lambda: START_MS)
    healthy = [_batch("w1", 0, "GPU-A", True), _batch("w2", 0, "GPU-A", False),
               _batch("w3", 0, "GPU-B", True)]
    result = metrics.process(_metrics_records(healthy), START_MS + 1000)
    metrics.save(result.states)
    outputs, states = cards.process(_card_records(result.outputs))
    cards.save(states)
    assert _told(outputs) == {"w1": 0.0, "w2": 0.0, "w3": 0.0}  # each learns its card once
    assert {o.event.gpu_uuid for o in outputs} == {"GPU-A", "GPU-B"}

    hot = [_batch("w1", 1, "GPU-A", True, throttle=0x20), _batch("w2", 1, "GPU-A", False)]
    records = _metrics_records(hot)
    records = [Record(r.topic, 0, 10 + r.offset, r.key, r.value) for r in records]
    result = metrics.process(records, START_MS + 2000)
    metrics.save(result.states)
    outputs, states = cards.process(_card_records(result.outputs))
    cards.save(states)
    assert _told(outputs) == {"w1": 1.0, "w2": 1.0}  # both, though only w1 samples it
    told = next(o.event for o in outputs if o.event.identity.worker_id == "w2")
    assert told.window == "card" and told.features["card_workers"] == 2.0


def test_a_member_that_joins_a_degraded_card_is_told_and_old_members_leave() -> None:
    job = CardJob(TOPICS, {}, member_ttl_s=60)

    def report(worker: str, at_s: int, reports: bool = False, throttled: bool = False):
        event = CardReport(event_time_ms=START_MS + at_s * 1000, gpu_uuid="GPU-A",
                           identity=_identity(worker), reports_card=reports,
                           throttled=throttled)
        return Record(TOPICS.gpu_cards, 0, at_s, b"GPU-A", encode(event))

    outputs, states = job.process([report("w1", 0, True, True), report("w2", 1),
                                   report("gone", 2)])
    job.save(states)
    assert _told(outputs) == {"w1": 1.0, "w2": 1.0, "gone": 1.0}
    outputs, states = job.process([report("w1", 100, True, False)])
    job.save(states)
    assert _told(outputs) == {"w1": 0.0}  # w2 and gone have not been heard of for 60 s
    assert set(job.states["GPU-A"].members) == {"w1"}


def test_a_bad_report_is_dead_lettered_and_the_rest_go_on() -> None:
    job = CardJob(TOPICS, {})
    good = CardReport(event_time_ms=START_MS, gpu_uuid="GPU-A", identity=_identity("w1"))
    outputs, _states = job.process([Record(TOPICS.gpu_cards, 0, 0, b"GPU-A", b"{nope"),
                                    Record(TOPICS.gpu_cards, 0, 1, b"GPU-A", encode(good))])
    assert [o.topic for o in outputs] == [TOPICS.dead_letters, TOPICS.features]
    assert job.counters.dead_letters == 1


def test_card_state_reads_back_from_table_bytes() -> None:
    table: dict[bytes, bytes] = {}
    states = card_state_table(table)
    job = CardJob(TOPICS, states)
    event = CardReport(event_time_ms=START_MS, gpu_uuid="GPU-A", identity=_identity("w1"),
                       reports_card=True, throttled=True)
    _outputs, new = job.process([Record(TOPICS.gpu_cards, 0, 0, b"GPU-A", encode(event))])
    job.save(new)
    assert list(table) == [b"GPU-A"]
    assert states["GPU-A"] == new["GPU-A"] and isinstance(states["GPU-A"], CardState)


def test_reports_go_out_on_news_and_then_every_interval() -> None:
    cards, news = card_news({}, ["GPU-A"], {}, 0, 30_000)
    assert [n.gpu_uuid for n in news] == ["GPU-A"]
    assert card_news(cards, ["GPU-A"], {}, 10_000, 30_000)[1] == []
    assert len(card_news(cards, ["GPU-A"], {}, 31_000, 30_000)[1]) == 1
    changed = card_news(cards, ["GPU-A"], {"GPU-A": True}, 10_000, 30_000)[1]
    assert [(n.reports_card, n.throttled) for n in changed] == [(True, True)]
    assert cards["GPU-A"] == CardSeen(reported_ms=0)


def test_the_metrics_job_tells_a_card_on_news_and_then_every_interval() -> None:
    # The worker's cards as last told live in its state from one message to the next: a
    # card job hears of an unchanged card once per interval, not once per message.
    job = MetricsJob(TOPICS, {}, clock_ms=lambda: START_MS, card_report_interval_s=30.0)
    told = []
    for second in range(40):
        throttle = 0x40 if second == 12 else 0
        records = _metrics_records([_batch("w1", second, "GPU-A", True, throttle)])
        records = [Record(r.topic, r.partition, second, r.key, r.value) for r in records]
        result = job.process(records, batch_ms=START_MS + second * 1000)
        job.save(result.states)
        told += [(second, o.event.throttled) for o in result.outputs
                 if o.topic == TOPICS.gpu_cards]
    assert told == [(0, False), (12, True), (13, False)]
