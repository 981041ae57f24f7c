"""dsec's log in an instrumented program: each message once.

A failure that repeats at step or flush rate (a broker that is away: every flush's lost
samples, every reconnect of the Kafka client) would otherwise fill the program's log. The
records are handed on as they would have propagated: to the program's handlers, or
Python's last resort when it has none.
"""

from __future__ import annotations

import logging

KAFKA_LOGGER = "dsec.kafka"  # the Kafka clients' own log (librdkafka), said once a kind


class OncePerMessage(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, ...]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        key: tuple[str, ...] = (record.name, str(record.msg))
        if record.name == KAFKA_LOGGER and isinstance(record.args, tuple):
            key += tuple(map(str, record.args[:2]))  # the Kafka client's: facility, client
        if key not in self._seen:
            self._seen.add(key)
            logging.getLogger().handle(record)

    @classmethod
    def install(cls, logger_name: str = "dsec") -> None:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(handler, cls) for handler in logger.handlers):
            logger.addHandler(cls())
            logger.propagate = False
