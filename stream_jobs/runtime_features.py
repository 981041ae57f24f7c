"""Features of a platform runtime (an agent platform registered through the ingest gateway)
from the ``runtime`` samples of one message: a pure function of the frame.

A runtime reports its type, concurrency, mean call latency and whether it calls functions
when it registers, and again whenever it posts a ``runtime`` sample. The latest report of
the message is what the runtime is now: its call latency (what the
``runtime-latency-backoff`` policy watches climb), its concurrency, and the latency per
concurrent call slot, which says how loaded each slot is. Stateless on purpose: a climb is
judged by the policy, over its ``for_s``, against its cap.
"""

from __future__ import annotations

import numpy as np

from dsec.schemas.frames import Frame


def runtime_features(frame: Frame) -> dict[str, float]:
    """The features of the message's last ``runtime`` sample (none for an empty frame)."""
    latencies_ms = frame["mean_call_latency_ms"]
    if latencies_ms.size == 0:
        return {}
    latest = int(np.argmax(frame["event_time_ms"]))  # the last report in event time
    latency_ms = float(latencies_ms[latest])
    concurrency = int(frame["concurrency"][latest])
    return {
        "runtime_call_latency_ms": latency_ms,
        "runtime_concurrency": float(concurrency),
        "runtime_call_latency_per_slot_ms": latency_ms / max(1, concurrency),
        "runtime_function_calling": float(bool(frame["function_calling"][latest])),
    }
