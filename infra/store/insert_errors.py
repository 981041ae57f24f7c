"""Why a ClickHouse insert failed: worth retrying as it is, or a rejection of the rows.

A lost connection, a busy or read-only server, a missing table or a denied user are
retried until they go away (the sink stalls and says why, nothing is dropped). Anything
else the server says about an insert is a rejection of what was sent — a value it cannot
store, or a block that spans too many partitions — and retrying the same block can never
succeed: the sink splits it, and what still fails on its own goes to the dead-letter topic.
"""

from __future__ import annotations

import re
from enum import Enum

from clickhouse_connect.driver.exceptions import OperationalError

# ClickHouse error codes (src/Common/ErrorCodes.cpp) that say nothing about the rows.
RETRY_CODES = frozenset({
    3,    # UNEXPECTED_END_OF_FILE
    8,    # THERE_IS_NO_COLUMN (schema not migrated yet)
    16,   # NO_SUCH_COLUMN_IN_TABLE
    60,   # UNKNOWN_TABLE
    81,   # UNKNOWN_DATABASE
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED
    425,  # SYSTEM_ERROR
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
    999,  # KEEPER_EXCEPTION
})
TOO_MANY_PARTS = 252
_CODE = re.compile(r"Code:\s*(\d+)")


class InsertFailure(Enum):
    RETRY = "retry"
    REJECTED = "rejected"


def error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    match = _CODE.search(str(exc))
    return int(match.group(1)) if match else None


def classify_insert_error(exc: BaseException) -> InsertFailure:
    if isinstance(exc, (OperationalError, OSError, TimeoutError)):
        return InsertFailure.RETRY
    code = error_code(exc)
    if code in RETRY_CODES:
        return InsertFailure.RETRY
    if code == TOO_MANY_PARTS and "single INSERT block" not in str(exc):
        return InsertFailure.RETRY  # merges are behind; a smaller block would not help
    return InsertFailure.REJECTED


def short_reason(table: str, exc: BaseException, limit: int = 600) -> str:
    """The dead letter's reason: which table refused it, and the server's first sentences."""
    text = " ".join(str(exc).split())
    return f"clickhouse rejected the insert into {table}: {text[:limit]}"
