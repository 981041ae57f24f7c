"""The probe's side work: a callback that raises is logged (once, when it runs every
flush) and the rest still run."""

from __future__ import annotations

import logging

from dsec.ingest.callbacks import Callbacks, WarnOnce


def _broken() -> None:
    raise RuntimeError("broken")


def test_a_failing_callback_never_stops_the_rest(caplog) -> None:
    ran: list[str] = []
    callbacks = Callbacks("step callback")
    callbacks.add(_broken)
    callbacks.add(lambda: ran.append("after"))
    with caplog.at_level(logging.ERROR, logger="dsec.ingest.callbacks"):
        callbacks.run()
        callbacks.run()
    assert ran == ["after", "after"]
    assert sum("step callback failed" in r.getMessage() for r in caplog.records) == 2


def test_collectors_log_each_one_failure_once(caplog) -> None:
    collectors = Callbacks("collector", log_each_failure=False)
    collectors.add(_broken)
    with caplog.at_level(logging.ERROR, logger="dsec.ingest.callbacks"):
        for _ in range(3):
            collectors.run()
    assert sum("keeps being called" in r.getMessage() for r in caplog.records) == 1


def test_warn_once_logs_each_kind_once(caplog) -> None:
    warn_once = WarnOnce()
    with caplog.at_level(logging.ERROR, logger="dsec.ingest.callbacks"):
        for what in ("norm", "norm", "loss"):
            try:
                _broken()
            except RuntimeError:
                warn_once(what, f"dsec: {what} failed")
    assert [r.getMessage() for r in caplog.records] == ["dsec: norm failed", "dsec: loss failed"]
