"""The C probe library: its own C unit tests, plain and under ASan/UBSan; an unchanged
program under LD_PRELOAD and the ctypes lines, both posting to the real gateway (its
publisher recording what would go to Kafka)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from gateway_server import RecordingPublisher, serving
from native_build import LIBRARY, TRAIN_PROGRAM, build_library_and_program, make

from dsec.ingest.gateway_config import GatewayConfig
from dsec.native import NativeLibraryError, NativeProbe, load
from dsec.schemas import MetricBatch

TOKEN = "enrolment-token"


@pytest.fixture(scope="module")
def built() -> None:
    build_library_and_program()


def _rows(batches: list[MetricBatch], worker_id: str) -> list:
    return [row for batch in batches if batch.identity.worker_id == worker_id
            for row in batch.rows()]


def test_c_unit_tests_pass_plain_and_under_sanitizers() -> None:
    done = make("test", timeout_s=600)
    summaries = [line for line in done.stdout.splitlines() if line.endswith("failed")]
    assert summaries == ["20 tests, 0 failed"] * 2, done.stdout[-3000:]
    assert "runtime error" not in done.stderr  # UBSan reports without failing by itself


def test_a_preloaded_program_is_reported_with_no_change(built) -> None:
    publisher = RecordingPublisher()
    with serving(GatewayConfig(token=TOKEN), publisher) as gateway:
        env = {**os.environ, "LD_PRELOAD": str(LIBRARY), "DSEC_ENDPOINT": gateway.url,
               "DSEC_ENDPOINT_TOKEN": TOKEN, "DSEC_SANDBOX_ID": "sandbox-3",
               "DSEC_NODE_ID": "node-a"}
        done = subprocess.run([str(TRAIN_PROGRAM), "12", "65536"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    did = json.loads(done.stdout)
    rows = _rows(publisher.batches(), "sandbox-3")
    kinds = Counter(row.kind for row in rows)
    assert kinds["runtime"] == 1 and kinds["grad_sync"] == did["all_reduces"] == 11
    syncs = [row for row in rows if row.kind == "grad_sync"]
    assert {(s.bytes, s.ok, s.op, s.timer) for s in syncs} == {
        (did["all_reduce_bytes"], True, "nccl_all_reduce", "wall_clock")}
    assert all(s.latency_ms >= 0.2 for s in syncs)  # the NCCL double's wire time, 200 us
    memory = max((row for row in rows if row.kind == "cuda_memory"),
                 key=lambda row: row.event_time_ms)
    assert memory.oom_count == did["ooms"] == 1
    # the weights stay allocated; the gradients and the last activations were freed
    assert memory.allocated_bytes == did["weights_bytes"]
    assert memory.peak_allocated_bytes >= 2 * did["weights_bytes"]
    heartbeat = max((row for row in rows if row.kind == "heartbeat"),
                    key=lambda row: row.samples_recorded)
    assert heartbeat.samples_dropped == 0
    assert heartbeat.samples_recorded == len(rows) - kinds["runtime"]
    assert {batch.identity.node_id for batch in publisher.batches()} == {"node-a"}


def test_a_program_that_never_touches_cuda_registers_nothing(built) -> None:
    """Children of a preloaded program (a shell, a compiler) inherit LD_PRELOAD: the
    library starts on first use only."""
    publisher = RecordingPublisher()
    with serving(GatewayConfig(token=TOKEN), publisher) as gateway:
        env = {**os.environ, "LD_PRELOAD": str(LIBRARY), "DSEC_ENDPOINT": gateway.url,
               "DSEC_ENDPOINT_TOKEN": TOKEN, "DSEC_WORKER_ID": "quiet"}
        done = subprocess.run(["sh", "-c", "echo hello"], env=env, capture_output=True,
                              text=True, timeout=60)
    assert done.stdout == "hello\n" and publisher.published == []


def test_the_three_ctypes_lines_land_through_the_loader_and_raw_ctypes(built) -> None:
    publisher = RecordingPublisher()
    with serving(GatewayConfig(token=TOKEN), publisher) as gateway:
        # a process of its own for each: one library instance per process
        script = textwrap.dedent(f"""
            import ctypes, json
            lib = ctypes.CDLL({str(LIBRARY)!r})
            lib.dsec_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            lib.dsec_report_episode_end.argtypes = [ctypes.c_double, ctypes.c_int64]
            assert lib.dsec_init(b"{gateway.url}", b"raw-agent") == 0
            lib.dsec_report_episode_end(12.5, 200)
            lib.dsec_shutdown()
        """)
        env = {**os.environ, "DSEC_ENDPOINT_TOKEN": TOKEN}
        raw = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=60)
        assert raw.returncode == 0, raw.stderr
        loader = textwrap.dedent(f"""
            import json
            from dsec import native
            probe = native.NativeProbe()
            probe.init("{gateway.url}", "loader-agent")
            probe.report_episode_end(7.25, 31)
            probe.report_step(0.5, 1.5)
            print(json.dumps(probe.shutdown().__dict__))
        """)
        loaded = subprocess.run([sys.executable, "-c", loader], env=env, capture_output=True,
                                text=True, timeout=60)
        assert loaded.returncode == 0, loaded.stderr
    batches = publisher.batches()
    [raw_episode] = [r for r in _rows(batches, "raw-agent") if r.kind == "episode"]
    assert (raw_episode.reward, raw_episode.length) == (12.5, 200)
    rows = _rows(batches, "loader-agent")
    [episode] = [r for r in rows if r.kind == "episode"]
    [step] = [r for r in rows if r.kind == "step"]
    assert (episode.reward, episode.length) == (7.25, 31)
    assert (step.loss, step.grad_norm, step.grad_norm_source) == (0.5, 1.5, "trainer")
    counts = json.loads(loaded.stdout)
    assert counts["samples_dropped"] == 0
    assert counts["samples_recorded"] == counts["samples_sent"] == len(rows) - 1  # runtime


def test_undeclared_argument_types_are_what_the_loader_prevents(built) -> None:
    """Without argtypes ctypes refuses a Python float for a C double: the reason the
    loader declares every signature."""
    raw = ctypes.CDLL(str(LIBRARY))
    with pytest.raises(ctypes.ArgumentError):
        raw.dsec_report_episode_end(12.5, 200)
    lib = load(LIBRARY)
    assert lib.dsec_report_episode_end.argtypes == [ctypes.c_double, ctypes.c_int64]
    lib.dsec_report_episode_end(12.5, 200)  # nothing running: ignored


def test_init_refusals_raise_with_the_reason(built, monkeypatch) -> None:
    monkeypatch.delenv("DSEC_ENDPOINT_TOKEN", raising=False)
    probe = NativeProbe(load(LIBRARY))
    with pytest.raises(NativeLibraryError, match="DSEC_ENDPOINT_TOKEN") as refused:
        probe.init("http://127.0.0.1:9", "agent-7")
    assert refused.value.code == -1
    with pytest.raises(NativeLibraryError, match="not built"):
        load(LIBRARY.parent / "missing.so")


def test_the_per_call_benchmark_measures_both_builds() -> None:
    from dsec.bench.native import run_native_bench

    result = run_native_bench(calls_per_block=2000, blocks=3)
    assert result["report_step_ns"] > result["noop_ns"] > 0
    assert result["cost_ns"] == pytest.approx(result["report_step_ns"] - result["noop_ns"],
                                              abs=0.2)
    assert result["samples_dropped"] == 0
    assert result["samples_sent"] == result["samples_recorded"]
