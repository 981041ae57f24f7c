"""``dsec bench backlog``: the real ``dsec up --services policy-engine`` works through a
backlog of feature columns on a real broker and commits every message."""

from __future__ import annotations

import pytest

from dsec.bench.backlog import BacklogOptions, run_backlog_bench


def test_the_engine_commits_the_whole_backlog_and_reports_its_rate(kafka_bootstrap) -> None:
    options = BacklogOptions(messages=60, rows=100, workers=1000, timeout_s=120)
    result = run_backlog_bench(options, kafka_bootstrap)
    assert result["feature_events"] == 6000
    assert result["backlog_mb"] > 0
    assert result["peak_rss_mb"] >= result["rss_at_first_commit_mb"] > 0
    # None where the first look at the group's offsets found the backlog already read
    rate = result["feature_events_per_s"]
    assert rate is None or rate > 0


def test_rows_must_divide_the_fleet() -> None:
    with pytest.raises(ValueError, match="rows must divide workers"):
        BacklogOptions(rows=300, workers=1000)
