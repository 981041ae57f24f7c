"""``dsec experiment goodput``: three arms on one broker, side by side, at the same time.

Each arm has its own dsec stack (stream jobs and policy engine, own topic prefix) and N
worker processes. plain and strong: every policy in dry run, so dsec only observes. dsec:
the policies act. The same scenario, schedule and seeds drive all three. A supervisor
restarts a dead worker in every arm the same way (a warm spare, forked from the arm's
fork server of warmed workers, after the scenario's restart delay); what differs
(``arms.ArmConfig``) is what the group resumes from, whether the survivors keep their
weights, and how often it has to.

A scenario with a fleet gives each arm cards of named GPU models, more than workers;
a worker starts on the fleet's layout. Without placement a restarted worker comes back on
its own card; with it, the arm's stack also runs the personality job and the restarter
asks the recommendation API (over HTTP on a loopback port) for the best free card.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from dsec.experiment.arms import ARM_CONFIGS, ARMS
from dsec.experiment.assignment import Assignment, Timeline
from dsec.experiment.faults import Scenario, fault_schedule, scale_scenario
from dsec.experiment.fleet import WORKLOAD, Card, choose_card, first_cards, fleet_layout
from dsec.experiment.measure import ArmResult, measure_arm, read_timelines
from dsec.experiment.progress import Beat, WatchdogConfig, read_beat, slots_to_restart
from dsec.experiment.slow_host import REFERENCE_UPDATE_S, SlowHost, calibrate_update_s
from dsec.experiment.warm_forks import ForkedWorker, fork_spare, new_ready_file

MIN_SPARES_PER_ARM = 2
MAX_SPARES_PER_ARM = 4
WORKER_MODULE = "dsec.experiment.worker"
FORK_SERVER_MODULE = "dsec.experiment.warm_forks"
WORKER_NICENESS = 19
READY_TIMEOUT_S = 600.0  # three arms of trainers at nice 19 on a busy host start slowly
WATCHDOG_INTERVAL_S = 0.5


class ExperimentError(RuntimeError):
    pass


@dataclass(frozen=True)
class GoodputOptions:
    workers: int = 8
    duration_s: float = 120.0
    workers_per_group: int = 2
    seed: int = 0
    bootstrap: str | None = None  # None: a broker of our own
    run_dir: Path | None = None
    # Every worker's CPU work takes this many times as long (a slower host).
    cpu_slowdown: float = 1.0
    # Every wall-clock span of the scenario, and the run, stretched by this; None: by the
    # host's measured update time over the reference host's (``slow_host``).
    time_scale: float | None = 1.0
    arms: tuple[str, ...] = ARMS
    # The restarter asks the recommendation API where a restarted worker goes (a
    # scenario with a fleet); off: it comes back on its own card.
    placement: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.arms) - set(ARMS)
        if not self.arms or unknown:
            raise ValueError(f"arms must be among {', '.join(ARMS)}; got {list(self.arms)}")


def spares_per_arm(workers: int) -> int:
    """Warm spares kept per arm: a NaN burst ends a data-parallel pair twice within
    seconds, and the fork that replaces a spare taken waits at nice 19 behind every
    trainer for its turn, so half the arm's workers are kept ready, between 2 and 4."""
    return max(MIN_SPARES_PER_ARM, min(MAX_SPARES_PER_ARM, workers // 2))


# A worker process: a new interpreter (``_spawn_worker``) or a fork of an arm's fork server.
Worker = subprocess.Popen | ForkedWorker


@dataclass
class _Slot:
    arm: str
    index: int
    process: Worker
    incarnation: int = 0
    restart_at: float | None = None
    assigned_at: float = 0.0
    card: Card | None = None


def _spawn_worker(env: dict[str, str], log_path: Path, cpu_slowdown: float = 1.0,
                  module: str = WORKER_MODULE) -> subprocess.Popen:
    """A worker waiting for its assignment on stdin, or (``FORK_SERVER_MODULE``) an arm's
    fork server of warm spares; the ready file is touched once it has warmed up."""
    log = log_path.open("ab")
    ready_file = new_ready_file(log_path)
    # Workers run at a lower CPU priority than the dsec stacks, in both arms alike: on a
    # real cluster the stream jobs and the policy engine have machines of their own and
    # do not queue behind the trainers for CPU, as they would on one small host.
    # A process group of their own (out of a terminal's Ctrl-C), but not a session: where
    # the kernel groups CPU time by session (autogroup), a session per worker would give
    # each one a whole session's share whatever its nice value, and 16 of them would
    # outweigh the broker and the stacks 16 to 1.
    process = subprocess.Popen(
        [sys.executable, "-m", module, str(ready_file), str(cpu_slowdown)],
        env=env,
        stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, process_group=0,
        preexec_fn=lambda: os.nice(WORKER_NICENESS))
    process.ready_file = ready_file  # type: ignore[attr-defined]
    return process


def _wait_ready(processes: list[Worker], deadline: float) -> None:
    """Until every process has imported and warmed up (a loaded machine takes a while)."""
    while not all(p.ready_file.exists() for p in processes):  # type: ignore[attr-defined]
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            raise ExperimentError("workers did not get ready; see the worker logs")
        time.sleep(0.2)


def _assign(process: Worker, assignment: Assignment) -> None:
    line = json.dumps(asdict(assignment)) + "\n"
    if isinstance(process, ForkedWorker):
        process.assign(line)
        return
    assert process.stdin is not None
    process.stdin.write(line.encode())
    process.stdin.flush()


def _arm_env(bootstrap: str, prefix: str, arm_dir: Path, sockets_dir: Path,
             job_id: str, dry_run: bool) -> dict[str, str]:
    """An arm's environment: its own topics, data and run folder (the node sockets), its
    workers taking commands from their node's actuator, as in production, its processes
    sharing the arm's keys in its data folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    env.update({
        "DSEC_BOOTSTRAP": bootstrap, "DSEC_TOPIC_PREFIX": prefix,
        "DSEC_DATA_DIR": str(arm_dir / "dsec-data"), "DSEC_RUN_DIR": str(sockets_dir),
        "DSEC_JOB_ID": job_id,
        "DSEC_ACTUATOR_CHANNEL": "node", "DSEC_POLICY_DRY_RUN": "1" if dry_run else "0",
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
    })
    return env


def _member_beats(members: list[_Slot], run_dir: Path) -> dict[int, Beat]:
    """The live members' beats. A member that has not beaten since its assignment (the
    beat file is its previous incarnation's, or none) is still starting (a spare taken
    before it warmed up may take minutes on a busy host) and is not judged yet, as a
    launcher watches a rank from its first heartbeat."""
    beats = {}
    for slot in members:
        if slot.restart_at is not None or slot.process.poll() is not None:
            continue
        beat = read_beat(run_dir / slot.arm / "beats" / f"worker-{slot.index:03d}")
        if beat is not None and beat.at_s >= slot.assigned_at:
            beats[slot.index] = beat
    return beats


def _restart_stuck(slots: list[_Slot], run_dir: Path, now: float, watchdog: WatchdogConfig,
                   collective_timeout_s: float, died: set[tuple[str, int]],
                   workers_per_group: int) -> None:
    """Kills the hung and the stuck, as each arm's launcher would; the supervisor loop then
    restarts them like any dead worker."""
    groups: dict[tuple[str, int], list[_Slot]] = {}
    for slot in slots:
        groups.setdefault((slot.arm, slot.index // workers_per_group), []).append(slot)
    for key, members in groups.items():
        arm = ARM_CONFIGS[key[0]]
        kill = slots_to_restart(_member_beats(members, run_dir), now,
                                watchdog if arm.progress_watchdog else None,
                                collective_timeout_s, peer_died=key in died)
        for slot in members:
            if slot.index in kill:
                slot.process.kill()
                slot.process.wait()
                Timeline(run_dir / slot.arm / f"timeline-{slot.index:03d}.jsonl").write(
                    "death", cause="hang", detail="killed by the launcher: no step progress")


def node_id(group: int) -> str:
    """The node a group's workers run on: one node per data-parallel group."""
    return f"node-{group:02d}"


def _publish_snapshot_period(settings, interval_s: float, dry_run: bool) -> None:
    """The periodic snapshot at the experiment's period: a newer version of the built-in,
    published on the policies topic like any custom policy."""
    from dsec.infra.keys import signer_for
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.policy_log import publish_policy
    from dsec.schemas.trust import KeyRole

    builtin = {p.name: p for p in load_builtin_policies()}["periodic-snapshot"]
    spec = builtin.model_copy(update={"version": builtin.version + 1,
                                      "cooldown_s": float(interval_s), "jitter_s": 0.0,
                                      "dry_run": dry_run,
                                      "signature": None})
    publish_policy(settings, signer_for(settings, KeyRole.POLICY_PUBLISHER).sign(spec))


def _publish_fleet(settings, cards: list[Card]) -> None:
    """The arm's cards on the topology topic, as ``dsec placement topology`` registers a
    node's: placement offers a card no worker has run on yet."""
    from dsec.infra.kafka_clients import make_producer
    from dsec.schemas import encode, now_ms, topic_names
    from dsec.schemas.placement import GpuTopologyEvent

    producer = make_producer(settings, "dsec-experiment-fleet")
    topic = topic_names(settings.topic_prefix).gpu_topology
    at_ms = now_ms()
    for card in cards:
        event = GpuTopologyEvent(event_time_ms=at_ms, node_id=f"node-{card.uuid}",
                                 gpu_uuid=card.uuid, gpu_model=card.model, gpu_index=0)
        producer.produce(topic, key=card.uuid.encode(), value=encode(event))
    if producer.flush(30):
        raise ExperimentError("the fleet's topology was not delivered")


def _placed_card(api, slot: _Slot, slots: list[_Slot], layout: list[Card]) -> tuple[Card, dict]:
    """Where the restarter puts ``slot``'s worker: the best-ranked card no other worker of
    its arm holds; its own card when the API has no answer."""
    assert slot.card is not None
    busy = {other.card.uuid for other in slots
            if other.arm == slot.arm and other is not slot and other.card is not None}
    asked_s = time.monotonic()
    try:
        ranked = [gpu["gpu_uuid"] for gpu in api.recommend({"workload": WORKLOAD})["ranked"]]
        error = None
    except OSError as exc:  # HTTP errors included: the worker goes back where it was
        ranked, error = [], f"{type(exc).__name__}: {exc}"
    chosen = choose_card(ranked, busy, slot.card.uuid)
    card = next(c for c in layout if c.uuid == chosen)
    return card, {"ask_s": round(time.monotonic() - asked_s, 3), "error": error,
                  "ranked": ranked[:4]}


def _placement_summary(moves: list[dict], leaky_models: set[str]) -> dict:
    return {"restarts": len(moves),
            "restarts_on_leaky_model": sum(move["to_model"] in leaky_models for move in moves),
            "moved": sum(move["from"] != move["to"] for move in moves), "moves": moves}


def run_goodput(scenario: Scenario, options: GoodputOptions) -> dict:
    """Runs the arms at once; returns ``{"plain": {...}, "strong": {...}, "dsec": {...},
    "run": {...}}`` (the arms of ``options.arms``). SIGTERM stops the broker, stacks,
    actuators and workers it started before the process ends."""
    from dsec.infra.stop_signals import exit_on_sigterm

    with exit_on_sigterm():
        return _run_goodput(scenario, options)


def _run_goodput(scenario: Scenario, options: GoodputOptions) -> dict:
    from contextlib import ExitStack

    import torch.distributed as dist

    from dsec.actuators.channel import socket_path
    from dsec.experiment.decisions import count_decisions
    from dsec.experiment.recommend_api import RecommendationServer
    from dsec.infra.kafka_local import LocalKafka
    from dsec.infra.topics import ensure_topics
    from dsec.placement.api import HistorySource
    from dsec.placement.topic_history import topic_history
    from dsec.schemas.settings import DsecSettings
    from dsec.services.stack import read_stack_state, stop_process

    calibration_s = calibrate_update_s(SlowHost(options.cpu_slowdown))
    time_scale = calibration_s / REFERENCE_UPDATE_S if options.time_scale is None \
        else options.time_scale
    scenario = scale_scenario(scenario, time_scale)
    duration_s = options.duration_s * time_scale
    run_dir = Path(options.run_dir or tempfile.mkdtemp(prefix="dsec-goodput-")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    started_s = time.monotonic()
    run_id = f"goodput-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    kafka = None
    services: list[subprocess.Popen] = []  # each arm's stream jobs and policy engine
    actuators: list[subprocess.Popen] = []  # the node actuators
    sockets: list[Path] = []
    # Unix socket paths are short (108 bytes): the node sockets live under /tmp.
    sockets_root = Path(tempfile.mkdtemp(prefix="dsec-nodes-"))
    processes: list[Worker] = []
    arms = options.arms
    fleet = scenario.fleet
    layouts = {arm: fleet_layout(fleet, arm) for arm in arms} if fleet is not None else {}
    placing = options.placement and fleet is not None
    apis: dict[str, RecommendationServer] = {}
    servers = ExitStack()
    try:
        bootstrap = options.bootstrap
        if bootstrap is None:
            kafka = LocalKafka(data_dir=run_dir / "kafka")
            bootstrap = kafka.start()
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=60))
        groups = -(-options.workers // options.workers_per_group)
        envs: dict[str, dict[str, str]] = {}
        settings_by_arm = {}
        for arm in arms:
            arm_dir = run_dir / arm
            arm_dir.mkdir(parents=True, exist_ok=True)
            prefix = f"{run_id.replace('goodput-', 'gp')}-{arm}"
            arm_sockets = sockets_root / arm
            env = _arm_env(bootstrap, prefix, arm_dir, arm_sockets, f"{run_id}-{arm}",
                           dry_run=ARM_CONFIGS[arm].dry_run)
            envs[arm] = env
            settings = DsecSettings(bootstrap=bootstrap, topic_prefix=prefix,
                                    data_dir=arm_dir / "dsec-data")
            settings_by_arm[arm] = settings
            ensure_topics(settings)
            _publish_snapshot_period(settings, scenario.snapshot_interval_s,
                                     dry_run=ARM_CONFIGS[arm].dry_run)
            if placing:
                _publish_fleet(settings, layouts[arm])
                apis[arm] = servers.enter_context(RecommendationServer(
                    HistorySource(topic_history(settings), refresh_s=0.0)))
            log = (arm_dir / "stack.log").open("wb")
            services.append(subprocess.Popen(
                [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", bootstrap,
                 "--services", "stream-jobs,policy-engine" + (",placement" if placing else "")],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            for group in range(groups):
                store.add(f"{arm}/group-{group}/gen", 0)
                # The node actuator of each group's node: it keeps its workers' desired
                # state and gives it back to a worker that restarts.
                actuator_log = (arm_dir / f"actuator-{node_id(group)}.log").open("wb")
                actuators.append(subprocess.Popen(
                    [sys.executable, "-m", "dsec.cli", "actuator", "--node", node_id(group),
                     "--bootstrap", bootstrap, "--run-dir", str(arm_sockets)],
                    env={**env, "DSEC_METRICS_PORT": "0"}, stdout=actuator_log,
                    stderr=subprocess.STDOUT, start_new_session=True))
                sockets.append(socket_path(arm_sockets, node_id(group)))
        plan_path = run_dir / "plan.json"
        schedule = fault_schedule(scenario, options.workers, duration_s, options.seed)
        plan_path.write_text(json.dumps({
            "scenario": scenario.model_dump(mode="json"),
            "schedule": [e.to_json() for e in schedule],
        }))
        slots: list[_Slot] = []
        spares: dict[str, list[Worker]] = {arm: [] for arm in arms}
        forks: dict[str, subprocess.Popen] = {}
        for arm in arms:
            forks[arm] = _spawn_worker(envs[arm], run_dir / arm / "fork-server.log",
                                       options.cpu_slowdown, FORK_SERVER_MODULE)
            processes.append(forks[arm])
            cards = first_cards(layouts[arm], options.workers) if fleet is not None else []
            for index in range(options.workers):
                process = _spawn_worker(envs[arm], run_dir / arm / f"worker-{index:03d}.log",
                                        options.cpu_slowdown)
                processes.append(process)
                slots.append(_Slot(arm, index, process, card=cards[index] if cards else None))
            for _ in range(spares_per_arm(options.workers)):
                spare = fork_spare(forks[arm], run_dir / arm / "spare.log")
                processes.append(spare)
                spares[arm].append(spare)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for arm_dir, stack in zip((run_dir / arm / "dsec-data" for arm in arms), services,
                                  strict=True):
            while read_stack_state(arm_dir) is None:
                if stack.poll() is not None or time.monotonic() > deadline:
                    raise ExperimentError(f"a dsec stack did not start; see {arm_dir.parent}")
                time.sleep(0.2)
        for socket in sockets:
            while not socket.exists():
                if time.monotonic() > deadline:
                    raise ExperimentError(f"no node actuator listens on {socket}")
                time.sleep(0.2)
        _wait_ready([slot.process for slot in slots]
                    + [spare for arm in arms for spare in spares[arm]], deadline)
        t0_s = time.time() + 1.0
        end_at_s = t0_s + duration_s

        def assignment(slot: _Slot) -> Assignment:
            return Assignment(
                arm=slot.arm, slot=slot.index, group=slot.index // options.workers_per_group,
                rank=slot.index % options.workers_per_group,
                group_size=min(options.workers_per_group,
                               options.workers - (slot.index // options.workers_per_group)
                               * options.workers_per_group),
                node_id=node_id(slot.index // options.workers_per_group),
                store_port=store.port, run_dir=str(run_dir), scenario_file=str(plan_path),
                t0_s=t0_s, end_at_s=end_at_s, seed=options.seed, incarnation=slot.incarnation,
                job_id=f"{run_id}-{slot.arm}",
                gpu_uuid=slot.card.uuid if slot.card else "",
                gpu_model=slot.card.model if slot.card else "")

        for slot in slots:
            slot.assigned_at = time.time()
            _assign(slot.process, assignment(slot))
        exits: list[dict] = []
        watchdog = WatchdogConfig(scenario.progress_timeout_updates,
                                  scenario.progress_timeout_min_s)
        watched_at = time.time()
        died: set[tuple[str, int]] = set()
        moves: dict[str, list[dict]] = {arm: [] for arm in arms}
        while time.time() < end_at_s:
            now = time.time()
            if died or now - watched_at >= WATCHDOG_INTERVAL_S:
                _restart_stuck(slots, run_dir, now, watchdog, scenario.collective_timeout_s,
                               died, options.workers_per_group)
                watched_at, died = now, set()
            for slot in slots:
                if slot.restart_at is not None:
                    if now >= slot.restart_at:
                        if slot.card is not None:
                            before, asked = slot.card, {}
                            if placing:
                                slot.card, asked = _placed_card(apis[slot.arm], slot, slots,
                                                                layouts[slot.arm])
                            moves[slot.arm].append({
                                "slot": slot.index, "t": round(now - t0_s, 2),
                                "from": before.uuid, "to": slot.card.uuid,
                                "to_model": slot.card.model, **asked})
                        spare = spares[slot.arm].pop(0)
                        slot.process, slot.restart_at = spare, None
                        slot.assigned_at = time.time()
                        _assign(spare, assignment(slot))
                        replacement = fork_spare(forks[slot.arm],
                                                 run_dir / slot.arm / "spare.log")
                        processes.append(replacement)
                        spares[slot.arm].append(replacement)
                    continue
                code = slot.process.poll()
                if code is None:
                    continue
                exits.append({"arm": slot.arm, "slot": slot.index, "t": now, "code": code,
                              "incarnation": slot.incarnation})
                died.add((slot.arm, slot.index // options.workers_per_group))
                store.add(f"{slot.arm}/group-{slot.index // options.workers_per_group}/gen", 1)
                slot.incarnation += 1
                slot.restart_at = now + scenario.restart_delay_s
            time.sleep(0.05)
        for slot in slots:  # workers stop at end_at_s by themselves
            try:
                slot.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                slot.process.kill()
        for server in forks.values():  # it ends the spares left and then itself
            if server.stdin is not None:
                server.stdin.close()
        decisions = {arm: count_decisions(settings_by_arm[arm], t0_s) for arm in arms}
        (run_dir / "exits.json").write_text(json.dumps(exits))
        result: dict = {}
        leaky_models = {m.name for m in fleet.models if m.leak} if fleet is not None else set()
        for arm in arms:
            timelines = read_timelines(run_dir / arm)
            arm_result: ArmResult = measure_arm(timelines, t0_s, end_at_s)
            counts, decided = decisions[arm]
            result[arm] = {**arm_result.to_json(), "policy_decisions": counts,
                           "decision_timeline": decided}
            if fleet is not None:
                result[arm]["placement"] = _placement_summary(moves[arm], leaky_models)
        result["run"] = {"t0_s": t0_s, "scenario": scenario.name, "workers": options.workers,
                         "duration_s": round(duration_s, 2), "seed": options.seed,
                         "cpu_slowdown": options.cpu_slowdown,
                         "arms": list(arms), "placement": placing,
                         "calibration_update_s": round(calibration_s, 4),
                         "time_scale": round(time_scale, 3),
                         "run_dir": str(run_dir), "faults": len(schedule),
                         "wall_s": round(time.monotonic() - started_s, 1)}
        (run_dir / "result.json").write_text(json.dumps(result))
        return result
    finally:
        servers.close()
        for process in processes:
            if process.poll() is None:
                process.kill()
        for stack in [*services, *actuators]:
            stop_process(stack)
        shutil.rmtree(sockets_root, ignore_errors=True)
        if kafka is not None:
            kafka.stop()
            shutil.rmtree(run_dir / "kafka", ignore_errors=True)
