"""ClickHouse inserts that wait out what may go away and split what the server refuses.

An insert is retried for ever while its failure says nothing about the rows (see
``insert_errors``); a rejected block is split until the units the server refuses on their
own are known. Every insert holds the client lock: an embedded chDB store has one client,
shared with the query server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tenacity import Retrying, retry_if_not_exception_type, stop_never, wait_exponential

from dsec.infra.consumer_loop import OutputUnavailable
from dsec.infra.store.insert_errors import InsertFailure, classify_insert_error, short_reason
from dsec.infra.store.sink_batch import SinkCounters

log = logging.getLogger(__name__)
ATTEMPTS_WHILE_STOPPING = 3


class InsertRejected(Exception):
    """The server refused a block for what is in it; the same block will never go in."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Inserter:
    def __init__(self, client_lock: threading.Lock, counters: SinkCounters,
                 stop: threading.Event) -> None:
        self._client_lock = client_lock
        self._counters = counters
        self._stop = stop
        self.last_error: str | None = None

    def insert(self, table: str, insert: Callable[[], object]) -> None:
        """Retries what may go away (connection, load, schema not there yet) until the sink
        stops; raises ``InsertRejected`` at once when the server refuses the rows themselves,
        ``OutputUnavailable`` when the sink stops before the insert went in."""
        for attempt in Retrying(wait=wait_exponential(min=0.2, max=10), stop=stop_never,
                                retry=retry_if_not_exception_type(
                                    (InsertRejected, OutputUnavailable)),
                                reraise=True):
            with attempt:
                if (self._stop.is_set()
                        and attempt.retry_state.attempt_number > ATTEMPTS_WHILE_STOPPING):
                    raise OutputUnavailable(f"sink stopping; {table} batch not written")
                try:
                    with self._client_lock:
                        insert()
                except Exception as exc:
                    if classify_insert_error(exc) is InsertFailure.REJECTED:
                        self._counters.inserts_rejected += 1
                        raise InsertRejected(short_reason(table, exc)) from exc
                    self._counters.insert_retries += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("sink: insert into %s failed, retrying: %s", table, exc)
                    raise

    def split_insert(
        self,
        table: str,
        count: int,
        token: str,
        insert: Callable[[int, int, str], None],
        reject: Callable[[int, str], None],
    ) -> None:
        """Units [0, count) were refused as one block: halves are tried until the units
        refused on their own are known. Each part's token derives from the block's, so a
        replay of the same batch is still recognised."""
        parts = [(count // 2, count), (0, count // 2)]
        while parts:
            lo, hi = parts.pop()
            if hi <= lo:
                continue
            sub_token = f"{token}:{lo}-{hi}"
            try:
                self.insert(table, lambda lo=lo, hi=hi, k=sub_token: insert(lo, hi, k))
            except InsertRejected as exc:
                if hi - lo == 1:
                    reject(lo, exc.reason)
                else:
                    middle = (lo + hi) // 2
                    parts += [(middle, hi), (lo, middle)]
