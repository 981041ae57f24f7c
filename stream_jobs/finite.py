"""The rule that features never carry non-finite values: one message's update, checked.

A finite but huge input (a reward of 1e308) overflows in the window statistics (its
square is infinite); a feature event with such a value cannot be published. The message
is then refused as a whole, with the features named, and the worker's state stays as it
was before it, so the worker's later messages are derived as if it had never come. A
message whose update fails outright is refused the same way, with the failure as reason.
"""

from __future__ import annotations

import math

from dsec.schemas import WorkerIdentity
from dsec.schemas.frames import Frame
from dsec.stream_jobs import worker_features
from dsec.stream_jobs.worker_features import FeatureConfig, Update
from dsec.stream_jobs.worker_state import WorkerState


def nonfinite_outputs(update: Update) -> list[str]:
    """The names of the features (and GPU-profile fields) of ``update`` that are not finite."""
    bad = [name for name, value in update.features.items() if not math.isfinite(value)]
    for gpu in update.gpus:
        values = {"bandwidth_jitter": gpu.bandwidth_jitter,
                  **{f"regimes.{name}": sum(delta) for name, delta in gpu.regimes.items()}}
        bad += [f"gpu {gpu.gpu_uuid} {name}" for name, value in values.items()
                if not math.isfinite(value)]
    return sorted(bad)


def checked_update(
    state: WorkerState, frames: dict[str, Frame], partition: int, offset: int, now_ms: int,
    config: FeatureConfig, batch_id: str | None = None, identity: WorkerIdentity | None = None,
) -> tuple[Update, str | None]:
    """``worker_features.update``, and why its outputs cannot be published (None when they
    can). Where they cannot, the update returned holds the state unchanged."""
    try:
        update = worker_features.update(state, frames, partition, offset, now_ms, config,
                                        batch_id, identity)
    except Exception as exc:  # one message's features never stop the job's
        return (Update(state=state, skipped=True),
                f"features not computable: {type(exc).__name__}: {exc}")
    bad = nonfinite_outputs(update)
    if bad:
        return (Update(state=state, skipped=True),
                f"non-finite features from finite inputs (too large): {', '.join(bad)}")
    return update, None
