"""dsec's services as separate processes (``dsec up --services ...``), for the benchmarks
that kill, restart and weigh them one at a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsec.infra.kafka_local import die_with_parent
from dsec.services.stack import read_stack_state, stop_process


class ServiceStartError(RuntimeError):
    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(f"{message} (see {log_path})")
        self.log_path = log_path


@dataclass
class ServiceProcess:
    """One ``dsec up --services <services>`` with a data folder of its own (its state file
    says when it serves)."""

    services: str
    data_dir: Path
    env: dict[str, str]
    start_timeout_s: float = 180.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log_path(self) -> Path:
        return self.data_dir / "service.log"

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.poll() is None else None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "dsec.cli", "up", "--services", self.services,
                   "--data-dir", str(self.data_dir)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.start_timeout_s
        while (read_stack_state(self.data_dir) or {}).get("pid") != self.process.pid:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServiceStartError(f"dsec up --services {self.services} did not start",
                                        self.log_path)
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit, as a crash."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            assert self.process is not None
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


def status_bytes(pid: int | str, field: str) -> int | None:
    """A memory figure of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``; ``pid`` may be
    ``"self"``) in bytes, None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    """The process's resident set (VmRSS), None once it is gone."""
    return status_bytes(pid, "VmRSS")


def children(pid: int) -> list[int]:
    """The process's direct children (the sink child of a stack, say)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []
