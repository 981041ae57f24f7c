"""``dsec bench scale``'s whole stream-job process: the real ``dsec up --services
stream-jobs`` works through every probe message on a real broker."""

from __future__ import annotations

from dsec.bench.scale_process import measure_stream_process


def test_the_process_works_through_every_message_and_makes_its_feature_events(
        kafka_bootstrap) -> None:
    result = measure_stream_process(30, 4, flushes_per_s=2, bootstrap=kafka_bootstrap,
                                    timeout_s=120)
    assert result["workers"] == 30 and result["flushes_per_s"] == 2
    assert result["messages"] == 240  # every worker's second as two messages
    assert result["dead_letters"] == 0
    assert result["feature_events"] >= 240  # one a message, and a worker's lost-event
    # None where the first commit held every message: no CPU between two commits
    assert result["cores_per_100k_workers"] is None or result["cores_per_100k_workers"] > 0
