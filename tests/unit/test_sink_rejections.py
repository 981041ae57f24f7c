"""Rows the ClickHouse server refuses do not stall the sink: the block is split, what cannot
be stored alone goes to the dead-letter topic with the server's reason, the rest is stored."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from dsec.infra.store.insert_errors import InsertFailure, classify_insert_error

DAY_MS = 86_400_000


@pytest.mark.parametrize(("error", "expected"), [
    (OperationalError("Error HTTPConnectionPool: connection refused"), InsertFailure.RETRY),
    (ConnectionResetError(), InsertFailure.RETRY),
    (DatabaseError("Code: 60. DB::Exception: Unknown table expression identifier"),
     InsertFailure.RETRY),
    (DatabaseError("Code: 241. DB::Exception: Memory limit (total) exceeded"),
     InsertFailure.RETRY),
    (DatabaseError("Code: 252. DB::Exception: Too many parts (300). Merges are processing "
                   "significantly slower than inserts"), InsertFailure.RETRY),
    (DatabaseError("Code: 252. DB::Exception: Too many partitions for single INSERT block "
                   "(more than 100)."), InsertFailure.REJECTED),
    (DatabaseError("Code: 53. DB::Exception: Type mismatch in IN or VALUES section"),
     InsertFailure.REJECTED),
    (TypeError("unsupported operand"), InsertFailure.REJECTED),
])
def test_insert_errors_are_told_apart(error: Exception, expected: InsertFailure) -> None:
    assert classify_insert_error(error) is expected




