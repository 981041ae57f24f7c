"""``dsec bench all``: every benchmark and the goodput experiment at a short setting, one
after the other, each in a process of its own, gathered into one JSON object.

The parts that need Kafka share one broker (started here unless a bootstrap is given),
and each part's figures are what its own command prints with ``--json``. A part that
fails is reported as ``{"error": ...}`` and the others still run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dsec.bench import PIPELINE_SAMPLES

PARTS = ("probe_overhead", "pipeline", "store_layout", "snapshot", "policy_eval", "reaction",
         "compression", "goodput")


@dataclass(frozen=True)
class SuiteOptions:
    parts: tuple[str, ...] = PARTS
    probe_block_pairs: int = 150
    pipeline_samples: int = PIPELINE_SAMPLES
    snapshot_steps: int = 24
    policy_targets: int = 10_000
    reaction_trials: int = 30
    compression_steps: int = 4
    goodput_scenario: str = "smoke"
    goodput_workers: int = 2
    goodput_duration_s: float = 40.0
    bootstrap: str | None = None  # a running broker; else one is started for the suite

    def __post_init__(self) -> None:
        unknown = set(self.parts) - set(PARTS)
        if unknown or not self.parts:
            raise ValueError(f"parts must be among {', '.join(PARTS)}; got {sorted(unknown)}")


def part_arguments(part: str, options: SuiteOptions, bootstrap: str) -> list[str]:
    """The ``dsec`` command line of one part."""
    return {
        "probe_overhead": ["bench", "probe-overhead", "--json", "--bootstrap", bootstrap,
                           "--block-pairs", str(options.probe_block_pairs)],
        "pipeline": ["bench", "pipeline", "--json", "--bootstrap", bootstrap,
                     "--samples", str(options.pipeline_samples)],
        "store_layout": ["bench", "store-layout", "--json"],
        "snapshot": ["bench", "snapshot", "--json", "--steps", str(options.snapshot_steps)],
        "policy_eval": ["bench", "policy-eval", "--json",
                        "--targets", str(options.policy_targets)],
        "reaction": ["bench", "reaction", "--json", "--bootstrap", bootstrap,
                     "--trials", str(options.reaction_trials)],
        "compression": ["bench", "compression", "--json",
                        "--steps", str(options.compression_steps)],
        "goodput": ["experiment", "goodput", "--json", "--bootstrap", bootstrap,
                    "--scenario", options.goodput_scenario,
                    "--workers", str(options.goodput_workers),
                    "--duration-s", str(options.goodput_duration_s)],
    }[part]


def last_json_object(output: str) -> dict | None:
    """The last line of ``output`` that is a JSON object (what ``--json`` prints)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _run_part(arguments: list[str]) -> dict:
    # stderr passes through: progress and logs stay visible, stdout keeps only the JSON
    done = subprocess.run([sys.executable, "-m", "dsec.cli", *arguments],
                          stdout=subprocess.PIPE, text=True, check=False)
    figures = last_json_object(done.stdout)
    if done.returncode != 0 or figures is None:
        return {"error": f"`dsec {' '.join(arguments)}` exited with {done.returncode}"}
    return figures


def run_suite(options: SuiteOptions) -> dict:
    from dsec.infra.kafka_local import LocalKafka

    started_s = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="dsec-bench-all-"))
    kafka = None if options.bootstrap else LocalKafka(data_dir=work / "kafka")
    result: dict = {}
    wall_s: dict[str, float] = {}
    try:
        bootstrap = options.bootstrap or kafka.start()  # type: ignore[union-attr]
        for part in options.parts:
            part_started_s = time.monotonic()
            result[part] = _run_part(part_arguments(part, options, bootstrap))
            wall_s[part] = round(time.monotonic() - part_started_s, 1)
    finally:
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["run"] = {
        "wall_s": wall_s,
        "total_wall_s": round(time.monotonic() - started_s, 1),
        "broker": f"given at {options.bootstrap}" if options.bootstrap
        else "local, shared by the parts",
        "failed": [part for part in options.parts if "error" in result[part]],
    }
    return result
