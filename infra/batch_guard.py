"""A batch of a Faust stream handled so that acknowledging it loses nothing.

Faust's ``take_events`` acknowledges a batch in a ``finally``, also when its handling
raised, and an agent that raises is restarted on the next batch. So a batch is handled
here until it has an outcome worth acknowledging:

- a failed delivery (the producer refused a message, or the broker did not take it)
  handles the batch again, after a wait that doubles up to ``max_wait_s``, until every
  output is delivered. The outputs carry the same ids and are deduplicated downstream.
  Meanwhile the partition's commits stand still, which the worker's health reports;
- any other error dead-letters each message of the batch, with the error as its reason,
  and the stream goes on. The dead letters are delivered the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TypeVar

from dsec.infra.records import Output, Record

__all__ = ["BatchGuard", "DeliveryError", "Send", "delivered"]

T = TypeVar("T")

Send = Callable[[Output], Awaitable["asyncio.Future[object]"]]
"""Hands an output to the producer; the future it returns resolves on delivery."""

_log = logging.getLogger(__name__)


class DeliveryError(Exception):
    """A message the producer could not hand to the broker, or the broker did not take."""


async def delivered(sends: Sequence[asyncio.Future[object]]) -> None:
    """Waits for every send; any failure is a ``DeliveryError``."""
    if not sends:
        return
    try:
        await asyncio.gather(*sends)
    except DeliveryError:
        raise
    except Exception as exc:
        raise DeliveryError(repr(exc)) from exc


@dataclass
class BatchGuard:
    """Handles the batches of one job. ``on_dead_lettered``: told how many messages a
    failed batch sent to ``dead_letters_topic``."""

    job: str
    send: Send
    dead_letters_topic: str
    on_dead_lettered: Callable[[int], None] = lambda count: None
    first_wait_s: float = 0.5
    max_wait_s: float = 30.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    async def run(self, records: list[Record],
                  handle: Callable[[list[Record]], Awaitable[None]]) -> bool:
        """``handle`` until it delivers, or the batch dead-lettered if it fails otherwise;
        whether ``handle`` succeeded. ``handle`` must give the same outputs when run
        again: it saves state only after its outputs are delivered."""
        failure = await self._until_delivered(lambda: handle(records), len(records))
        if failure is None:
            return True
        await self._dead_letter(records, failure)
        return False

    async def processed(self, records: list[Record],
                        process: Callable[[list[Record]], T]) -> T | None:
        """``process(records)``, run once; if it raises, the batch dead-lettered and None."""
        try:
            return process(records)
        except Exception as exc:
            _log.exception("%s: a batch of %d failed", self.job, len(records))
            await self._dead_letter(records, exc)
            return None

    async def deliver(self, outputs: Sequence[Output], in_order: bool = False) -> None:
        """Every output delivered. ``in_order``: each run of outputs to one topic only once
        the runs before it are delivered (the outputs of a run are sent together, and the
        producer keeps their order within a partition); else all sent together."""
        runs = ([list(run) for _, run in groupby(outputs, key=lambda output: output.topic)]
                if in_order else [list(outputs)])

        async def send_all() -> None:
            for run in runs:
                await delivered([await self.send(output) for output in run])

        failure = await self._until_delivered(send_all, len(outputs))
        if failure is not None:
            raise failure

    async def _until_delivered(self, attempt: Callable[[], Awaitable[None]],
                               size: int) -> Exception | None:
        """None once ``attempt`` ran through; the error if it failed other than in
        delivery."""
        wait_s = self.first_wait_s
        while True:
            try:
                await attempt()
                return None
            except DeliveryError as exc:
                _log.warning("%s: a batch of %d not delivered (%s); again in %.1f s",
                             self.job, size, exc, wait_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.exception("%s: a batch of %d failed", self.job, size)
                return exc
            await self.sleep(wait_s)
            wait_s = min(2 * wait_s, self.max_wait_s)

    async def _dead_letter(self, records: list[Record], error: Exception) -> None:
        cause = f"{type(error).__name__}: {error}"[:500]
        reason = f"{self.job} could not handle this message's batch: {cause}"
        letters = [Output(self.dead_letters_topic, record.topic.encode(),
                          record.dead_letter(reason)) for record in records]

        try:
            await self.deliver(letters)
        except Exception as failure:  # a dead letter that cannot be sent: say so, go on
            _log.error("%s: %d messages neither handled nor dead-lettered: %r", self.job,
                       len(records), failure)
            return
        self.on_dead_lettered(len(letters))
