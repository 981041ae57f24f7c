"""What the supervisor hands an experiment worker, and the timeline the worker writes."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Assignment:
    arm: str  # one of arms.ARMS
    slot: int
    group: int
    rank: int
    group_size: int
    node_id: str
    store_port: int
    run_dir: str
    scenario_file: str  # JSON: {"scenario": ..., "schedule": [...]}
    t0_s: float  # epoch seconds of the run's start (fault times are relative to it)
    end_at_s: float  # epoch seconds
    seed: int
    incarnation: int
    job_id: str
    # The worker's card in the scenario's fleet; empty: a card of its own, named by slot.
    gpu_uuid: str = ""
    gpu_model: str = ""

    @property
    def arm_dir(self) -> Path:
        return Path(self.run_dir) / self.arm


class Timeline:
    """The worker's JSONL timeline: updates, episodes, actions and their outcomes,
    resumes, its death. Written from the training and the sampling thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": round(time.time(), 4), **fields}) + "\n"
        with self._lock:
            self._handle.write(line)
