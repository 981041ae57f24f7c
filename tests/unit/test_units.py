"""The one set of unit conversions, and a naive --since time read as UTC in any local zone."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from dsec.history_features import parse_since
from dsec.schemas.units import duration_ms, epoch_ms, from_epoch_ms, ms_to_s, s_to_ms


def test_seconds_and_milliseconds_convert_both_ways() -> None:
    assert s_to_ms(1.5) == 1500 and s_to_ms(0.0019) == 1  # truncated, as int() does
    assert duration_ms(0.0015) == pytest.approx(1.5)
    assert ms_to_s(250) == 0.25
    assert from_epoch_ms(1_767_225_600_000) == datetime(2026, 1, 1, tzinfo=UTC)
    moment = datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert epoch_ms(moment) == 1_767_225_600_000


def test_a_naive_since_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        assert parse_since("2026-01-01T00:00:00", 0) == 1_767_225_600_000
        assert parse_since("2026-01-01T01:00:00+01:00", 0) == 1_767_225_600_000
    finally:
        monkeypatch.undo()
        time.tzset()
