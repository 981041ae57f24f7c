"""Small helpers shared by the tests."""

from __future__ import annotations

import pytest


def wait_for(predicate, timeout_s: float, interval_s: float = 0.25, what: str = "condition"):
    """Polls ``predicate`` until it returns something truthy, or fails the test."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
