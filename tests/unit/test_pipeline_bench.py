"""``dsec bench pipeline``: how it charges CPU time to each side."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dsec.bench.pipeline import _child_pids, _cpu_s, _per_million, _ratio
from dsec.bench.pipeline_limit import consume_batch

linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def test_cpu_per_million_samples() -> None:
    assert _per_million(0.5, 2_000_000) == 0.25
    assert _per_million(None, 1_000) is None
    assert _per_million(1.0, 0) is None


def test_a_short_run_is_read_in_ten_batches_at_least_and_an_untimed_side_has_no_ratio() -> None:
    assert [consume_batch(n) for n in (10_000, 500, 5, 50_000)] == [1000, 50, 1, 1000]
    assert _ratio(1.0, 4.0) == 0.25
    assert _ratio(0.0, 4.0) is None and _ratio(1.0, 0.0) is None


@linux_only
def test_a_process_cpu_time_grows_as_it_works() -> None:
    before = _cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = _cpu_s(os.getpid())
    assert before is not None and after is not None and after > before


@linux_only
def test_a_child_is_found_and_a_gone_process_has_no_cpu_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in _child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert _cpu_s(child.pid) is None


def test_the_limit_side_stores_every_decoded_sample_in_plain_tables(tmp_path) -> None:
    """What the limit side inserts: each kind's columns of the probe's packed batches, in
    plain MergeTree tables, every sample once; a field a batch lacks is null."""
    import orjson

    from dsec.bench.pipeline_limit import arrow_tables, decoded_columns, limit_table_statements
    from dsec.bench.traces import TraceIdentity, training_batch
    from dsec.infra.store.clickhouse import connect
    from dsec.schemas.metrics import encode_packed

    identity = TraceIdentity(job_id="j", worker_id="w-0", node_id="n", start_ms=1_700_000_000_000)
    documents = [decoded_columns(orjson.loads(encode_packed(training_batch(identity, i, 50))))
                 for i in range(3)]
    del documents[1]["step"]["grad_norm"]  # a batch without one field
    expected = {kind: sum(d[kind]["event_time_ms"].size for d in documents if kind in d)
                for kind in documents[0]}
    client = connect(f"chdb://{tmp_path / 'limit'}")
    try:
        for statement in limit_table_statements():
            client.command(statement)
        for kind, table in arrow_tables(documents).items():
            client.insert_arrow(f"limit_{kind}", table)
        for kind, samples in expected.items():
            assert client.command(f"SELECT count() FROM limit_{kind}") == samples
        assert client.command("SELECT countIf(grad_norm IS NULL) FROM limit_step") == (
            documents[1]["step"]["event_time_ms"].size)
    finally:
        client.close()


def test_the_bare_and_the_validating_consumer_count_the_same_samples() -> None:
    from dsec.bench.pipeline import _decode_columns, _decode_validated
    from dsec.bench.traces import TraceIdentity, training_batch
    from dsec.schemas.metrics import encode_packed

    value = encode_packed(training_batch(TraceIdentity(), 2, 300))
    assert _decode_columns(value) == _decode_validated(value) == 300
