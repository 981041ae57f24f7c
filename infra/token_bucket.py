"""Token buckets: a rate with a burst, per key, on an injected clock.

``refill`` is the arithmetic; ``TokenBuckets`` keeps one bucket per key (a runtime, a
worker) and forgets the least recently used keys past ``max_keys``, so a flood of new keys
costs bounded memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_s: float


def refill(bucket: Bucket, now_s: float, rate_per_s: float, burst: float) -> Bucket:
    """The bucket at ``now_s``: ``rate_per_s`` tokens a second since it was updated, at most
    ``burst``. A clock that went back adds nothing."""
    elapsed_s = max(0.0, now_s - bucket.updated_s)
    return Bucket(min(burst, bucket.tokens + elapsed_s * rate_per_s), max(now_s, bucket.updated_s))


def wait_s(bucket: Bucket, cost: float, rate_per_s: float) -> float:
    """Seconds until ``bucket`` holds ``cost`` tokens; 0 when it holds them now."""
    missing = cost - bucket.tokens
    return 0.0 if missing <= 0 else missing / rate_per_s


class TokenBuckets:
    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("a token bucket needs rate_per_s > 0, burst >= 1, max_keys >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Takes ``cost`` tokens from ``key``'s bucket and returns 0, or takes nothing and
        returns the seconds to wait before they are there."""
        now_s = self._clock()
        with self._lock:
            bucket = self._buckets.pop(key, None) or Bucket(self.burst, now_s)
            bucket = refill(bucket, now_s, self.rate_per_s, self.burst)
            wait = wait_s(bucket, cost, self.rate_per_s)
            if wait == 0.0:
                bucket = Bucket(bucket.tokens - cost, bucket.updated_s)
            self._buckets[key] = bucket
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
            return wait
