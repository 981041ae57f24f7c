"""Fault scenarios (YAML) and the deterministic fault schedule drawn from one.

Rates are per simulated hour; ``sim_hour_s`` wall seconds make one simulated hour, so a
night of faults fits in minutes. The schedule is a pure function of the scenario, the
worker count, the run length and the seed: the same inputs give the same faults, in
both arms of an experiment.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from dsec.experiment.fleet import Fleet

FaultKind = Literal[
    "memory_leak", "thermal_throttle", "sync_jitter", "sync_stall", "stuck_episodes",
    "nan_burst", "crash", "straggler", "silent_hang", "flaky_card",
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "memory_leak", "thermal_throttle", "sync_jitter", "sync_stall", "stuck_episodes",
    "nan_burst", "crash", "straggler", "silent_hang", "flaky_card",
)
# Instantaneous faults: a worker started after one does not meet it again.
INSTANT_KINDS = frozenset({"crash", "silent_hang"})
Rate = Annotated[float, Field(ge=0)]
Targets = list[Annotated[int, Field(ge=0)]] | None  # worker (= GPU = link) indices; None: all


class _Fault(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rate_per_hour: Rate = 0.0
    targets: Targets = None


class MemoryLeak(_Fault):
    """While active, the card fragments ``bytes_per_step`` per environment step of every
    episode at least ``long_episode_steps`` long (a leak on long episodes only).
    ``live_share`` of those bytes are live tensors instead, which nothing reclaims until
    the fault ends (a cap below them waits: deferred, then applied)."""

    duration_h: Rate = 1.0
    long_episode_steps: int = Field(default=150, ge=1)
    bytes_per_step: int = Field(default=4 << 20, ge=0)
    live_share: float = Field(default=0.0, ge=0.0, le=1.0)


class ThermalThrottle(_Fault):
    duration_h: Rate = 1.0


class SyncJitter(_Fault):
    """The worker's link runs at ``degraded_bytes_per_s`` with Gaussian jitter."""

    duration_h: Rate = 1.0
    degraded_bytes_per_s: float = Field(default=100e6, gt=0)
    jitter_ms: Rate = 20.0


class SyncStall(_Fault):
    stall_s: Rate = 3.0


class StuckEpisodes(_Fault):
    """The environment replays the same start and ignores the agent: episodes end the
    same way, at the same place."""

    duration_h: Rate = 0.5


class NanBurst(_Fault):
    """Gradient-norm spikes for ``precursor_s``, then ``burst_steps`` steps of NaN loss.
    ``precursor_s: 0``: the burst comes without warning."""

    precursor_s: Rate = 8.0
    spike_factor: float = Field(default=50.0, ge=1)
    burst_steps: int = Field(default=4, ge=1)


class Crash(_Fault):
    """The worker process dies (a segfault, a lost host): no warning, no remedy."""


class Straggler(_Fault):
    """The worker's device runs ``slowdown`` times slower (no thermal signature): its
    group's all-reduce waits for it every step."""

    duration_h: Rate = 1.0
    slowdown: float = Field(default=3.0, ge=1.0)


class SilentHang(_Fault):
    """The training loop stops stepping (a deadlock in a data loader, a wedged kernel) while
    the process, its heartbeat thread and its sockets live on. It does not end by itself."""


class FlakyCard(_Fault):
    """The worker's card fails (an Xid, the process dies) ``fail_after_s`` after each start
    of a worker on it while the fault lasts: restarting on the same card does not help."""

    duration_h: Rate = 2.0
    fail_after_s: float = Field(default=10.0, gt=0)


class Faults(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    memory_leak: MemoryLeak = MemoryLeak()
    thermal_throttle: ThermalThrottle = ThermalThrottle()
    sync_jitter: SyncJitter = SyncJitter()
    sync_stall: SyncStall = SyncStall()
    stuck_episodes: StuckEpisodes = StuckEpisodes()
    nan_burst: NanBurst = NanBurst()
    crash: Crash = Crash()
    straggler: Straggler = Straggler()
    silent_hang: SilentHang = SilentHang()
    flaky_card: FlakyCard = FlakyCard()


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    sim_hour_s: float = Field(default=10.0, gt=0)
    seed: int = 0
    # Both arms restart a dead worker after this delay (a scheduler's reaction time).
    restart_delay_s: Rate = 0.5
    # The plain arm's periodic full checkpoint, and dsec's periodic snapshot and the strong
    # arm's asynchronous checkpoint (wall seconds; the article's 10 min and 90 s, in the
    # same ratio).
    checkpoint_interval_s: float = Field(default=60.0, gt=0)
    snapshot_interval_s: float = Field(default=9.0, gt=0)
    # How long a group's collective waits for a member before it fails (gloo's timeout; a
    # hung member holds its group this long).
    collective_timeout_s: float = Field(default=20.0, gt=0)
    # The strong and dsec arms' launcher restarts a worker that has not stepped for this
    # many of its own mean update durations (at least the floor): a window in steps. A
    # worker beats at every optimizer step's agreement and all-reduce, so its longest
    # healthy silence is one update (the largest accumulation window); three leave room
    # for a straggler's slower updates and stay under the collective timeout on a host
    # where an update takes 3 s, so the hung member goes before its peers time out.
    progress_timeout_updates: float = Field(default=3.0, gt=0)
    progress_timeout_min_s: float = Field(default=4.0, gt=0)
    faults: Faults = Faults()
    # Cards of named GPU models (more than workers); None: one anonymous card per worker.
    fleet: Fleet | None = None


@dataclass(frozen=True)
class FaultEvent:
    kind: FaultKind
    worker: int
    start_s: float
    end_s: float  # == start_s for instantaneous faults (crash, stall start, burst start)

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def to_json(self) -> dict:
        return {"kind": self.kind, "worker": self.worker, "start_s": round(self.start_s, 3),
                "end_s": round(self.end_s, 3)}


def _stream_seed(seed: int, kind: str, worker: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{kind}/{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _span_s(scenario: Scenario, kind: FaultKind, fault: _Fault) -> float:
    if kind == "sync_stall":
        return fault.stall_s  # type: ignore[attr-defined]
    if kind == "nan_burst":
        return fault.precursor_s  # type: ignore[attr-defined]
    duration_h = getattr(fault, "duration_h", 0.0)
    return duration_h * scenario.sim_hour_s


def fault_schedule(
    scenario: Scenario, workers: int, duration_s: float, seed: int | None = None
) -> tuple[FaultEvent, ...]:
    """Every fault of the run, by start time: a Poisson process per (fault, target) at the
    scenario's rate, each from a random stream of its own (adding a worker or a fault kind
    leaves the others' faults where they were)."""
    seed = scenario.seed if seed is None else seed
    events: list[FaultEvent] = []
    for kind in FAULT_KINDS:
        fault: _Fault = getattr(scenario.faults, kind)
        if fault.rate_per_hour <= 0:
            continue
        rate_per_s = fault.rate_per_hour / scenario.sim_hour_s
        targets = range(workers) if fault.targets is None else fault.targets
        for worker in sorted({t for t in targets if t < workers}):
            rng = np.random.default_rng(_stream_seed(seed, kind, worker))
            t_s = float(rng.exponential(1.0 / rate_per_s))
            while t_s < duration_s:
                events.append(FaultEvent(kind, worker, t_s, t_s + _span_s(scenario, kind, fault)))
                t_s += float(rng.exponential(1.0 / rate_per_s))
    return tuple(sorted(events, key=lambda e: (e.start_s, e.kind, e.worker)))


def ready_scenarios() -> list[str]:
    folder = resources.files("dsec.experiment").joinpath("scenarios")
    return sorted(e.name[:-5] for e in folder.iterdir() if e.name.endswith(".yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A scenario file, or the name of a ready one (``quiet``, ``bad-night``, ...)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        text = path.read_text()
    else:
        entry = resources.files("dsec.experiment").joinpath("scenarios", f"{name_or_path}.yaml")
        if not entry.is_file():
            raise FileNotFoundError(
                f"no scenario file {name_or_path!r} and no ready scenario of that name "
                f"(ready: {', '.join(ready_scenarios())})"
            )
        text = entry.read_text()
    return Scenario.model_validate(yaml.safe_load(text))


def scale_scenario(scenario: Scenario, factor: float) -> Scenario:
    """The scenario on a host ``factor`` times slower: every span given in wall seconds
    (the simulated hour, and with it every duration and rate; precursors, stalls,
    intervals, timeouts) stretched by ``factor``, so a fault lasts as many steps. The
    scheduler's restart delay is the cluster's, not the host's: it stays."""
    if factor == 1.0:
        return scenario
    faults = scenario.faults
    return scenario.model_copy(update={
        "sim_hour_s": scenario.sim_hour_s * factor,
        "checkpoint_interval_s": scenario.checkpoint_interval_s * factor,
        "snapshot_interval_s": scenario.snapshot_interval_s * factor,
        "collective_timeout_s": scenario.collective_timeout_s * factor,
        "progress_timeout_min_s": scenario.progress_timeout_min_s * factor,
        "faults": faults.model_copy(update={
            "nan_burst": faults.nan_burst.model_copy(
                update={"precursor_s": faults.nan_burst.precursor_s * factor}),
            "sync_stall": faults.sync_stall.model_copy(
                update={"stall_s": faults.sync_stall.stall_s * factor}),
            "flaky_card": faults.flaky_card.model_copy(
                update={"fail_after_s": faults.flaky_card.fail_after_s * factor}),
        }),
    })
