"""``dsec doctor --gpu``: the runner, the comparisons it judges by, and the checks' bodies
on the CPU (the same code runs on a GPU with ``device="cuda"``)."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dsec.bench.gpu_check import (
    CHECKS,
    CheckSpec,
    GpuCheckOptions,
    all_reduce_timing,
    autocast_switching,
    run_gpu_checks,
    snapshot_blocking,
)
from dsec.bench.gpu_check import probe_overhead as probe_check
from dsec.bench.gpu_check.nvml_readings import MIB, compare_gpu, parse_smi_csv
from dsec.bench.gpu_check.process_memory import find_own_process
from dsec.bench.gpu_check.runner import HostGpu
from dsec.cli import app

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_a_host_without_a_gpu_says_so_for_every_check_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["doctor", "--gpu", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output.strip().splitlines()[-1])
    assert set(answer["checks"]) == {spec.name for spec in CHECKS}
    for outcome in answer["checks"].values():
        assert outcome["status"] == "skipped"
        assert outcome["reason"].startswith("no GPU: ")
    assert answer["summary"] == {"ok": 0, "failed": 0, "skipped": len(CHECKS)}
    assert answer["host"]["cuda"] is False


def test_doctor_without_a_category_says_what_it_checks() -> None:
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 2


def test_every_check_resolves_to_a_function_without_touching_cuda() -> None:
    for spec in CHECKS:
        module_name, _, function_name = spec.target.partition(":")
        assert callable(getattr(importlib.import_module(module_name), function_name))
    assert not torch.cuda.is_initialized()


_GPU_HOST = HostGpu(cuda=True, cuda_reason="", nvml=False, nvml_reason="NVML unavailable",
                    nvidia_smi=True, nvidia_smi_reason="")


def test_each_check_runs_apart_within_its_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(TESTS), os.environ.get("PYTHONPATH", "")]))
    specs = (
        CheckSpec("hangs", "gpu_check_targets:hangs", frozenset({"cuda"}), 4.0),
        CheckSpec("raises", "gpu_check_targets:raises", frozenset({"cuda"}), 30.0),
        CheckSpec("passes", "gpu_check_targets:passes", frozenset({"cuda"}), 30.0),
        CheckSpec("needs_nvml", "gpu_check_targets:passes", frozenset({"nvml"}), 30.0),
    )
    answer = run_gpu_checks(GpuCheckOptions(), host=_GPU_HOST, specs=specs)
    checks = answer["checks"]
    assert checks["hangs"]["status"] == "failed"
    assert checks["hangs"]["reason"] == "timed out after 4 s"
    assert checks["raises"]["status"] == "failed"
    assert checks["raises"]["reason"] == "RuntimeError: the driver said no"
    assert checks["passes"]["status"] == "ok" and checks["passes"]["figures"] == {"answer": 42}
    assert checks["needs_nvml"] == {"status": "skipped", "figures": {},
                                    "reason": "no GPU: NVML unavailable"}
    assert answer["summary"] == {"ok": 1, "failed": 2, "skipped": 1}


def test_unknown_checks_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown checks"):
        run_gpu_checks(GpuCheckOptions(checks=("warp_drive",)), host=_GPU_HOST)


SMI_OUTPUT = """GPU-aaaa, 1024, 143771, 41, 1980, 120.50, 3, NVIDIA H200
GPU-bbbb, 600, 143771, [N/A], [Not Supported], [N/A], 0, NVIDIA H200, rev, b
"""


def _nvml(uuid: str, used_mib: float, total_mib: float = 143771.0,
          temperature_c: float = 42.0) -> dict:
    return {"gpu_uuid": uuid, "memory_used_bytes": int(used_mib * MIB),
            "memory_total_bytes": int(total_mib * MIB), "temperature_c": temperature_c}


def test_nvidia_smi_rows_parse_with_fields_a_board_lacks() -> None:
    rows = parse_smi_csv(SMI_OUTPUT)
    assert rows["GPU-aaaa"]["memory.used"] == 1024.0
    assert rows["GPU-aaaa"]["power.draw"] == 120.5
    assert rows["GPU-bbbb"]["temperature.gpu"] is None
    assert rows["GPU-bbbb"]["name"] == "NVIDIA H200, rev, b"


def test_nvml_and_nvidia_smi_agree_or_the_gap_is_named() -> None:
    smi = parse_smi_csv(SMI_OUTPUT)["GPU-aaaa"]
    problems, _ = compare_gpu([_nvml("GPU-aaaa", 1000), _nvml("GPU-aaaa", 1030)], smi, None)
    assert problems == []
    # newer drivers: nvidia-smi leaves out what the driver reserves, NVML's v1 counts it
    problems, figures = compare_gpu([_nvml("GPU-aaaa", 1600)], smi, 576 * MIB)
    assert problems == [] and "576 MiB" in figures["memory_used_note"]
    problems, _ = compare_gpu([_nvml("GPU-aaaa", 3000, total_mib=80000, temperature_c=60)],
                              smi, None)
    assert len(problems) == 3


def test_the_process_is_found_by_pid_or_by_what_it_allocated() -> None:
    gib = 1 << 30
    before = {(0, 100): gib // 2, (0, 4242): 2 * gib, (1, 77): 9 * gib}
    after = {(0, 100): gib // 2, (0, 4242): 3 * gib, (1, 77): 9 * gib}
    assert find_own_process(before, after, 4242, gib) == ((0, 4242), "pid")
    key, how = find_own_process(before, after, 17, gib)
    assert key == (0, 4242) and how.startswith("memory growth")
    key, how = find_own_process(before, before, 17, gib)
    assert key is None and "none has PID 17" in how


def test_one_gpu_times_nccl_alone_and_two_processes_over_gloo() -> None:
    assert [(p.backend, p.world) for p in all_reduce_timing.plans(1, True)] == [
        ("nccl", 1), ("gloo", 2)]
    assert [(p.backend, p.world) for p in all_reduce_timing.plans(8, True)] == [("nccl", 2)]
    figures = all_reduce_timing.bandwidth_figures(1_000_000_000, 2, [100.0, 200.0, 300.0])
    assert figures["algorithm_gb_per_s"] == 5.0 and figures["bus_gb_per_s"] == 5.0


def test_precision_switches_under_training_on_the_cpu() -> None:
    outcome = autocast_switching.run("cpu", steps_per_phase=8, features=32, hidden=64,
                                     batch=64)
    assert outcome.status == "ok", outcome.reason
    assert [p["output_dtypes"] for p in outcome.figures["phases"]] == [
        ["bfloat16"], ["float16"], ["bfloat16"], ["float16"]]
    assert [p["loss_scaling"] for p in outcome.figures["phases"]] == [False, True, False, True]


def test_snapshot_blocking_measures_on_the_cpu() -> None:
    outcome = snapshot_blocking.run("cpu", hidden=64, layers=2, batch=32, plain_steps=3,
                                    snapshots=2)
    assert outcome.status == "ok", outcome.reason
    assert outcome.figures["snapshots_taken"] == 2
    assert outcome.figures["state_bytes"] > 0


def test_probe_overhead_measures_on_the_cpu() -> None:
    outcome = probe_check.run("cpu", block_pairs=2, steps_per_block=5, warmup_steps=5)
    assert outcome.status == "ok"
    assert outcome.figures["step_ms_off"] > 0 and outcome.figures["samples_sent"] > 0
