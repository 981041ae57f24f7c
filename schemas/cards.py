"""Which workers share a GPU card, and what the card's own readings say: the metrics job's
reports to the card job, keyed by the card's UUID so that one card's reports meet."""

from __future__ import annotations

from dsec.schemas.base import Event, Identifier, WorkerIdentity

__all__ = ["CardReport"]


class CardReport(Event):
    """A worker on card ``gpu_uuid``: ``reports_card`` when it samples the card through
    NVML, and then ``throttled``, whether its last sample found the card throttling for
    heat. A worker that only names its card (its batches' ``gpu_uuid``, its CUDA device)
    is a member without a reading."""

    gpu_uuid: Identifier
    identity: WorkerIdentity
    reports_card: bool = False
    throttled: bool = False
