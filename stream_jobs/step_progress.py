"""Liveness from step progress: a worker whose heartbeats keep coming while the step count
they carry stays put has stopped training (a silent hang: a wedged data loader or kernel,
a deadlock), which silence-based liveness (``worker_lost``) cannot see.

Counted in heartbeats, not seconds, once the worker has stepped at least once (before its
first step it is starting up, not stalled).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dsec.schemas.units import ms_to_s
from dsec.stream_jobs.worker_state import Heartbeat


def step_progress(previous: Heartbeat, steps: np.ndarray, now_ms: int,
                  out: dict[str, float]) -> Heartbeat:
    """The heartbeat state after a batch's heartbeats (``steps``: the step count each one
    carried, in order), with ``step_stalled_heartbeats`` and ``step_stalled_s`` in ``out``."""
    last_step, changed_ms, stalled = previous.last_step, previous.step_changed_ms, \
        previous.stalled_beats
    for step in (int(s) for s in steps):
        if step != last_step:  # moved (a restarted worker counts again from 0)
            last_step, changed_ms, stalled = step, now_ms, 0
        elif step > 0:
            stalled += 1
    out["step_stalled_heartbeats"] = float(stalled)
    out["step_stalled_s"] = 0.0 if changed_ms is None or stalled == 0 \
        else max(0.0, ms_to_s(now_ms - changed_ms))
    return replace(previous, last_step=last_step, step_changed_ms=changed_ms,
                   stalled_beats=stalled)
