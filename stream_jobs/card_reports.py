"""What the metrics job tells the card job about a worker's cards, and when.

A worker names its card in its batches' ``gpu_uuid`` and in the GPU samples it takes; a
worker that samples its card also says whether it is throttling. The card job learns
which workers share a card from these reports, so each is sent when the worker first
names a card, when its reading of the card changes, and every ``interval_ms`` while it
keeps naming it (so that a restarted card job, or one that dropped an idle member, learns
it again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dsec.stream_jobs.worker_state import CardSeen

__all__ = ["CardNews", "card_news"]


@dataclass(frozen=True)
class CardNews:
    gpu_uuid: str
    reports_card: bool
    throttled: bool


def card_news(
    cards: Mapping[str, CardSeen], named: Iterable[str], readings: Mapping[str, bool],
    now_ms: int, interval_ms: int,
) -> tuple[dict[str, CardSeen], list[CardNews]]:
    """The worker's cards after one batch and what to report. ``named``: the cards the
    batch names; ``readings``: card -> throttled, for the cards the batch sampled."""
    after = dict(cards)
    news = []
    for uuid in dict.fromkeys([*named, *readings]):
        before = cards.get(uuid)
        reports_card = uuid in readings or (before is not None and before.reports_card)
        throttled = readings.get(uuid, before.throttled if before is not None else False)
        changed = before is None or (reports_card, throttled) != (before.reports_card,
                                                                    before.throttled)
        if not changed and now_ms - before.reported_ms < interval_ms:
            continue
        after[uuid] = CardSeen(reported_ms=now_ms, reports_card=reports_card,
                               throttled=throttled)
        news.append(CardNews(uuid, reports_card, throttled))
    return after, news
