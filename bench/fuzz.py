"""``dsec bench fuzz``: the packed-column decoder and the policy decoder under a fuzzer,
each for a fixed time.

With atheris (``pip install 'dsec[fuzz]'``) each target runs coverage-guided in a process
of its own (``dsec.bench.fuzz_atheris``): libFuzzer ends that process at the first input
that breaks the rule, so the target is started again for the time left, and every input
found is kept in the artifacts folder. Without atheris the command says so and drives the
same targets with hypothesis's random inputs (``dsec.bench.fuzz_inputs``) for the same
time. The rule is the one the property tests check (``dsec.bench.fuzz_targets``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

TARGETS = ("packed-columns", "policy")
NOT_INSTALLED = ("atheris is not installed (pip install 'dsec[fuzz]'): fuzzing with "
                 "hypothesis's random inputs instead, for the same time")
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_PROBLEM = re.compile(r"FuzzFinding: (.*)")


@dataclass(frozen=True)
class FuzzOptions:
    seconds_per_target: float = 60.0
    targets: tuple[str, ...] = TARGETS
    engine: Literal["auto", "atheris", "hypothesis"] = "auto"
    artifacts_dir: Path | None = None  # where atheris writes the inputs it found

    def __post_init__(self) -> None:
        unknown = set(self.targets) - set(TARGETS)
        if unknown or not self.targets:
            raise ValueError(f"targets must be among {', '.join(TARGETS)}; got {sorted(unknown)}")
        if self.seconds_per_target <= 0:
            raise ValueError("seconds_per_target must be > 0")


@dataclass
class TargetRun:
    seconds: float = 0.0
    inputs: int = 0
    findings: list[dict[str, str]] = field(default_factory=list)

    def found(self, problem: str, where: str) -> None:
        if all(f["problem"] != problem for f in self.findings):
            self.findings.append({"problem": problem, "input": where})


def atheris_installed() -> bool:
    return importlib.util.find_spec("atheris") is not None


# --- atheris ---------------------------------------------------------------------------------


def _atheris_round(target: str, seconds: int, artifacts: Path, run: TargetRun) -> bool:
    """One libFuzzer process, until its time is up or its first finding; False when it
    ran no input at all (it could not start: nothing to gain from starting it again)."""
    before = set(artifacts.iterdir())
    command = [sys.executable, "-m", "dsec.bench.fuzz_atheris", target,
               f"-max_total_time={seconds}", f"-artifact_prefix={artifacts}/",
               "-print_final_stats=1", "-timeout=10", "-rss_limit_mb=4096"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=seconds + 120)
    output = done.stdout + done.stderr
    executed = sum(int(n) for n in _EXECUTED.findall(output))
    run.inputs += executed
    written = sorted(set(artifacts.iterdir()) - before)
    if done.returncode == 0 and not written:
        return True
    problems = _PROBLEM.findall(output)
    if problems:
        problem = problems[-1]
    else:
        lines = output.strip().splitlines() or [f"exit status {done.returncode}"]
        problem = lines[-1][:300]
    run.found(problem, str(written[0]) if written else "(no input written)")
    return executed > 0 or bool(written)


def fuzz_with_atheris(target: str, seconds: float, artifacts: Path) -> TargetRun:
    run = TargetRun()
    started_s = time.monotonic()
    while (left_s := seconds - (time.monotonic() - started_s)) >= 1:
        if not _atheris_round(target, int(left_s), artifacts, run):
            break
    run.seconds = round(time.monotonic() - started_s, 1)
    return run


# --- hypothesis -----------------------------------------------------------------------------


def _hypothesis_case(target: str) -> tuple[Any, Callable[[bytes], None]]:
    from dsec.bench import fuzz_inputs, fuzz_targets

    if target == "packed-columns":
        return fuzz_inputs.metric_batches(), fuzz_targets.metric_batch
    return fuzz_inputs.policies(), fuzz_targets.policy_record


def fuzz_with_hypothesis(target: str, seconds: float) -> TargetRun:
    """Rounds of fresh random inputs until the time is up; a round that finds an input
    breaking the rule reports it (shrunk) and the next round goes on."""
    from hypothesis import HealthCheck, given, settings

    from dsec.bench.fuzz_targets import FuzzFinding, prepare

    strategy, check = _hypothesis_case(target)
    prepare()
    run = TargetRun()
    started_s = time.monotonic()

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one_round(data: bytes) -> None:
        run.inputs += 1
        check(data)

    while time.monotonic() - started_s < seconds:
        try:
            one_round()
        except FuzzFinding as finding:
            run.found(finding.problem, repr(finding.data)[:500])
    run.seconds = round(time.monotonic() - started_s, 1)
    return run


# --- the command ------------------------------------------------------------------------------


def run_fuzz(options: FuzzOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every target for ``options.seconds_per_target``: per target the inputs tried and the
    findings (the problem, and the input or where it was written)."""
    installed = atheris_installed()
    engine = options.engine
    if engine == "atheris" and not installed:
        raise RuntimeError("atheris is not installed (pip install 'dsec[fuzz]')")
    if engine == "auto":
        engine = "atheris" if installed else "hypothesis"
        if not installed:
            say(NOT_INSTALLED)
    artifacts = options.artifacts_dir or Path(tempfile.mkdtemp(prefix="dsec-fuzz-"))
    artifacts.mkdir(parents=True, exist_ok=True)
    runs = {}
    for target in options.targets:
        if engine == "atheris":
            runs[target] = fuzz_with_atheris(target, options.seconds_per_target, artifacts)
        else:
            runs[target] = fuzz_with_hypothesis(target, options.seconds_per_target)
    result: dict[str, Any] = {
        "engine": engine,
        "targets": {name: {"seconds": run.seconds, "inputs": run.inputs,
                           "findings": run.findings} for name, run in runs.items()},
    }
    if engine == "atheris":
        result["artifacts"] = str(artifacts)
    elif not installed:
        result["atheris"] = "not installed"
    return result
