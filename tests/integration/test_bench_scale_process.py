"""``dsec bench scale``'s whole stream-job process: the real ``dsec up --services
stream-jobs`` works through every probe message on a real broker."""

from __future__ import annotations

from dsec.bench.scale_process import measure_stream_process


def test_the_process_works_through_every_message_and_makes_its_feature_events(
        kafka_bootstrap) -> None:
    result = measure_stream_process(30, 4, bootstrap=kafka_bootstrap, timeout_s=120)
    assert result["workers"] == 30
    assert result["messages"] == 120
    assert result["dead_letters"] == 0
    assert result["feature_events"] >= 120  # one a message, and a worker's lost-event
