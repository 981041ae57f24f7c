"""The extra wait a policy's ``jitter_s`` adds to a target's cooldown.

Drawn, not random: the same target and last fire give the same wait in every engine
(a restarted one, a replay), and a new fire draws a new one. Targets that fired in the
same step get waits spread evenly over ``[0, jitter_ms)``, so their next fires fall in
different steps, and each fire after spreads them further.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["cooldown_jitter_ms", "target_hash"]

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def target_hash(target: str) -> int:
    """A stable 32-bit hash of a target's name (``job|worker``)."""
    return zlib.crc32(target.encode())


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        z = (values + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return z ^ (z >> np.uint64(31))


def cooldown_jitter_ms(target_hashes: np.ndarray, last_fired_ms: np.ndarray,
                       jitter_ms: float) -> np.ndarray:
    """Per row, the wait in ``[0, jitter_ms)`` added to the cooldown after the row's
    target last fired at ``last_fired_ms`` (int64 ms; any value where it never fired)."""
    if jitter_ms <= 0:
        return np.zeros(np.shape(last_fired_ms), dtype=np.int64)
    key = ((np.asarray(target_hashes, dtype=np.uint64) << np.uint64(32))
           ^ np.asarray(last_fired_ms, dtype=np.int64).astype(np.uint64))
    fraction = (_mix(key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return (fraction * jitter_ms).astype(np.int64)
