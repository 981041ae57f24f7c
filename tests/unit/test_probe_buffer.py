"""The probe's bounded buffer: every sample recorded is sent, dropped or still held."""

from __future__ import annotations

from dsec.ingest.buffer import ProbeCounters, SampleBuffer


def _counts(buffer: SampleBuffer) -> tuple[int, int, int, int, int]:
    c = buffer.counters()
    return (c.samples_recorded, c.samples_sent, c.samples_buffered, c.samples_dropped,
            c.messages_failed)


def test_a_full_buffer_drops_and_counts() -> None:
    buffer = SampleBuffer(max_samples=3)
    for index in range(5):
        buffer.record(("episode", index))
    assert _counts(buffer) == (5, 0, 3, 2, 0)
    assert buffer.take(10) == [("episode", 0), ("episode", 1), ("episode", 2)]


def test_a_refused_chunk_goes_back_to_the_front_and_always_fits() -> None:
    buffer = SampleBuffer(max_samples=3)
    for index in range(3):
        buffer.record(("s", index))
    chunk = buffer.take(2)
    buffer.record(("s", 3))  # the chunk out keeps its place: no room for this one
    assert _counts(buffer) == (4, 0, 3, 1, 0)
    buffer.handed_over(chunk, accepted=False)
    assert buffer.take(10) == [("s", 0), ("s", 1), ("s", 2)]


def test_delivery_reports_settle_what_was_handed_over() -> None:
    buffer = SampleBuffer(max_samples=10)
    for index in range(5):
        buffer.record(("s", index))
    first, second = buffer.take(2), buffer.take(2)
    buffer.handed_over(first, accepted=True)
    buffer.handed_over(second, accepted=True)
    assert buffer.counters().samples_buffered == 5  # in flight still counts as held
    buffer.delivered(len(first), ok=True)
    buffer.delivered(len(second), ok=False)
    lost = buffer.take(1)
    buffer.lost(len(lost))  # could not even be encoded
    buffer.message_failed()  # a message of another kind
    assert _counts(buffer) == (5, 2, 0, 3, 3)


def test_the_heartbeat_counts_itself_and_meets_the_bound() -> None:
    buffer = SampleBuffer(max_samples=2)
    buffer.record(("s", 0))
    buffer.record_heartbeat(event_time_ms=1_700_000_000_000, interval_s=5.0, global_step=7)
    chunk = buffer.take(10)
    # sent 0, buffered 1 (before itself), dropped 0, recorded 2 (itself included), failed 0
    assert chunk[1] == ("heartbeat", 1_700_000_000_000, 5.0, 7, 0, 1, 0, 2, 0)
    buffer.handed_over(chunk, accepted=True)
    buffer.delivered(len(chunk), ok=True)
    buffer.record(("s", 1))
    buffer.record(("s", 2))
    buffer.record_heartbeat(event_time_ms=1_700_000_000_001, interval_s=5.0, global_step=8)
    assert buffer.counters() == ProbeCounters(
        samples_recorded=5, samples_sent=2, samples_buffered=2, samples_dropped=1,
        messages_failed=0)
