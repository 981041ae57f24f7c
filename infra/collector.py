"""Python's cyclic garbage collector, tuned for a long-running service process.

CPython collects its youngest generation every 700 net allocations of container objects.
A stream job's batch allocates thousands (decoded columns, feature dicts, outputs) that
die with the batch, so the default runs a young collection every few messages, and the
full collections that follow scan every worker's state: about a fifth of a stream-job
process's CPU at probe rates. Objects a batch leaves behind are freed by reference
counting; the collector is only needed for cycles, which are rare here. A service raises
the young threshold once it has started (``young_objects``), and freezes what it loaded
before (modules, compiled policies) out of every later collection.
"""

from __future__ import annotations

import gc

__all__ = ["tune_collector"]


def tune_collector(young_objects: int) -> tuple[int, int, int]:
    """Collect the youngest generation every ``young_objects`` net allocations (the older
    generations' thresholds unchanged), and move every object alive now into a permanent
    generation no collection scans. Returns the thresholds before."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young_objects, *before[1:])
    return before
