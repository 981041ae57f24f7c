"""Each failure class of detection on neutral workloads, on the real broker and the whole
stack (stream jobs, card job, policy engine, sink): probe-shaped messages in, decisions
and stored features out.

- a per-worker quota against the card's memory: healthy workers sharing a card stay
  quiet, a worker whose own CUDA memory grows is capped though another process on its
  card is the one that samples NVML, and two cards with a worker each give two feature
  sets of their own;
- stuck episodes on the worker's usual ending: a long run of time limits is nothing, a
  rare ending repeated fires with the run it saw in the alert;
- a degraded card: every worker on it is snapshotted, not only the one that samples it;
- features missing from an event: a ``for:`` policy over GPU and sync features fires;
- the worker's own CUDA memory is a feature;
- a reward variance jump among slow episodes is seen in a few episodes, not 40;
- ``dsec policy test --against-history`` replays the stored features through a policy.
- a stall of the input is not the loss of every worker: nobody is lost while nothing
  arrives, and a worker silent while the others go on is.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import orjson
import pytest
from helpers import start_stack, stop_stack, wait_for
from policy_broker import Reader
from typer.testing import CliRunner

from dsec.history import query
from dsec.infra.kafka_clients import make_producer
from dsec.infra.keys import signer_for
from dsec.infra.replay import replay
from dsec.infra.topics import ensure_topics
from dsec.policy_engine.policy_log import publish_policy
from dsec.schemas import PolicyDecision, PolicySpec, now_ms, topic_names
from dsec.schemas.base import SCHEMA_VERSION
from dsec.schemas.policies import DecisionKind
from dsec.schemas.settings import DsecSettings
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration
GIB = 1 << 30
START_MS = now_ms() - 3_600_000
ACTED = {DecisionKind.FIRED, DecisionKind.STAGED_UP}


class Worker:
    """One simulated worker's probe messages, a message a second of its time."""

    def __init__(self, worker_id: str, card: str) -> None:
        self.worker_id, self.card = worker_id, card
        self.identity = {"job_id": "detect", "worker_id": worker_id, "node_id": "node-1"}
        self.sent = 0

    def message(self, at_s: float, **columns: dict) -> dict:
        self.sent += 1
        t_ms = START_MS + int(at_s * 1000)
        beat = {"event_time_ms": [t_ms], "interval_s": [3600.0]}  # never lost in this test
        return {"schema_version": SCHEMA_VERSION,
                "event_id": f"{self.worker_id}-{self.sent:08d}", "event_time_ms": t_ms,
                "identity": self.identity, "gpu_uuid": self.card,
                "columns": {"heartbeat": beat, **columns}}

    def cuda(self, at_s: float, reserved: int) -> dict:
        return {"event_time_ms": [START_MS + int(at_s * 1000)], "device_index": [0],
                "allocated_bytes": [int(reserved * 0.9)], "reserved_bytes": [reserved]}

    def gpu(self, at_s: float, card_bytes: int, own: int | None, throttled: bool = False,
            temperature_c: float = 65.0) -> dict:
        return {"event_time_ms": [START_MS + int(at_s * 1000)], "gpu_uuid": [self.card],
                "memory_used_bytes": [card_bytes], "memory_total_bytes": [80 * GIB],
                "process_memory_used_bytes": [own], "temperature_c": [temperature_c],
                "throttle_reasons": [0x20 if throttled else 0]}

    def episodes(self, times_s: list[float], reasons: list[str],
                 rewards: list[float]) -> dict:
        first = self.sent * 1000
        return {"event_time_ms": [START_MS + int(t * 1000) for t in times_s],
                "episode_index": list(range(first, first + len(times_s))),
                "reward": rewards, "length": [100] * len(times_s),
                "termination_reason": reasons}

    def syncs(self, at_s: float, latency_ms: float) -> dict:
        return {"event_time_ms": [START_MS + int(at_s * 1000)], "step": [self.sent],
                "bytes": [1 << 20], "latency_ms": [latency_ms]}


def _mixed() -> list[dict]:
    """GPU samples and sync samples in separate messages, never together."""
    mixed = Worker("mixed", "GPU-H")
    healthy = int(6.5 * GIB)
    return [mixed.message(t, grad_sync=mixed.syncs(t, 150.0)) if t % 2 else
            mixed.message(t, gpu=mixed.gpu(t, healthy, healthy, temperature_c=91.0))
            for t in range(16)]


def _traffic() -> list[dict]:
    card_a = [Worker("a1", "GPU-A"), Worker("a2", "GPU-A")]  # healthy, 6.5 GiB each
    reporter_b, leaky = Worker("b-reporter", "GPU-B"), Worker("leaky", "GPU-B")
    own_c, own_d = Worker("c-alone", "GPU-C"), Worker("d-leaking", "GPU-D")
    usual, stuck = Worker("usual", "GPU-E"), Worker("stuck", "GPU-F")
    hot_reporter, hot_quiet = Worker("hot-reporter", "GPU-G"), Worker("hot-quiet", "GPU-G")
    slow = Worker("slow", "GPU-I")
    healthy = int(6.5 * GIB)
    out = []
    for t in range(60):
        a_card = 2 * healthy
        out.append(card_a[0].message(t, gpu=card_a[0].gpu(t, a_card, healthy),
                                     cuda_memory=card_a[0].cuda(t, healthy)))
        out.append(card_a[1].message(t, cuda_memory=card_a[1].cuda(t, healthy)))
        leaking = healthy + max(0, t - 20) * 300_000_000  # past 12 GiB from t=40
        out.append(reporter_b.message(t, gpu=reporter_b.gpu(t, healthy + leaking, healthy),
                                      cuda_memory=reporter_b.cuda(t, healthy)))
        out.append(leaky.message(t, cuda_memory=leaky.cuda(t, leaking)))
        out.append(own_c.message(t, gpu=own_c.gpu(t, 7 * GIB, 6 * GIB)))
        out.append(own_d.message(t, gpu=own_d.gpu(t, leaking + GIB, leaking)))
        hot = 20 <= t < 40
        out.append(hot_reporter.message(t, gpu=hot_reporter.gpu(t, 2 * healthy, healthy,
                                                                  throttled=hot)))
        out.append(hot_quiet.message(t, cuda_memory=hot_quiet.cuda(t, healthy)))
    # Endings: 'usual' ends 9 in 10 episodes by its time limit, then 12 in a row; 'stuck'
    # mostly by time limit too, then 5 collisions at the same place.
    common = (["time_limit"] * 9 + ["goal"]) * 6
    out.append(usual.message(100, episode=usual.episodes(
        [40 + i for i in range(60)], common, [1.0] * 60)))
    out.append(usual.message(130, episode=usual.episodes(
        [110 + i for i in range(12)], ["time_limit"] * 12, [1.0] * 12)))
    out.append(stuck.message(100, episode=stuck.episodes(
        [40 + i for i in range(60)], common, [1.0] * 60)))
    for i in range(5):
        out.append(stuck.message(110 + i, episode=stuck.episodes(
            [110 + i], ["collision_at_3_4"], [1.0])))
    # Slow episodes (one every 20 s): 30 calm returns, then 5 spread 8 times wider.
    calm = [10.0 + (0.8 if i % 2 else -0.8) * (1 + i % 3) for i in range(30)]
    wild = [10.0 + s * 8.0 * 1.2 for s in (1, -1, 1, -1, 1)]
    for i, reward in enumerate(calm + wild):
        out.append(slow.message(-900 + 20 * i, episode=slow.episodes(
            [-900 + 20 * i], ["time_limit"], [reward])))
    return out


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("detect")
    settings = DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            data_dir=data_dir)
    ensure_topics(settings)
    # A policy over features of two sample kinds, with a for: timer.
    publisher = signer_for(settings, KeyRole.POLICY_PUBLISHER)
    publish_policy(settings, publisher.sign(PolicySpec.model_validate({
        "name": "hot-and-slow", "version": 1, "for_s": 5, "cooldown_s": 600,
        "condition": "gpu_temperature_c > 85.0 && grad_sync_latency_p95_ms > 100.0",
        "action": {"params": {"kind": "snapshot"}}})))
    decisions = Reader(settings, topic_names(settings.topic_prefix).decisions, PolicyDecision)
    process = start_stack(kafka_bootstrap, data_dir, settings.topic_prefix)
    try:
        producer = make_producer(settings, "test-detection")
        lines = sorted((orjson.dumps(m) for m in _traffic()),
                       key=lambda line: orjson.loads(line)["event_time_ms"])
        replay(lines, producer, topic_names(settings.topic_prefix).metrics, speed=0)
        assert producer.flush(30) == 0
        # In time: the policy's for: timer runs on the times the stream job stamps.
        replay([orjson.dumps(m) for m in _mixed()], producer,
               topic_names(settings.topic_prefix).metrics, speed=1.0)
        assert producer.flush(30) == 0
        yield settings, decisions
    finally:
        stop_stack(process)
        decisions.close()


def _acted(decisions: Reader, timeout_s: float = 120.0, until=None) -> dict[str, set[str]]:
    """policy -> the workers it acted on, once ``until`` holds for that."""
    def acted(items):
        found: dict[str, set[str]] = {}
        for d in items:
            if d.identity is not None and d.decision in ACTED:
                found.setdefault(d.policy_name, set()).add(d.identity.worker_id)
        return found if until is None or until(found) else None

    return decisions.wait(acted, timeout_s, "the decisions")


def test_quota_on_own_memory_fires_on_the_leaking_workers_only(stack) -> None:
    settings, decisions = stack
    acted = _acted(decisions, until=lambda f: {"leaky", "d-leaking"} <= f.get(
        "elastic-memory-quota", set()))
    assert acted["elastic-memory-quota"] == {"leaky", "d-leaking"}
    # two cards, a worker each: a feature set each, not one card's figures for both
    rows = wait_for(lambda: query(settings, """
        SELECT worker_id, max(value) FROM features WHERE feature = 'gpu_memory_used_bytes'
          AND worker_id IN ('c-alone', 'd-leaking') GROUP BY worker_id""")["rows"], 60,
        what="the stored GPU features")
    card = dict(rows)
    assert card["c-alone"] == 7 * GIB and card["d-leaking"] > 13 * GIB
    own = dict(query(settings, """
        SELECT worker_id, max(value) FROM features WHERE feature = 'gpu_process_memory_bytes'
        GROUP BY worker_id""")["rows"])
    assert own["a1"] == own["a2"] == 6.5 * GIB  # their card holds 13 GiB
    assert own["leaky"] > 12 * GIB  # from its CUDA allocator alone: it samples no NVML
    cuda = query(settings, "SELECT max(value) FROM features WHERE worker_id = 'leaky' "
                           "AND feature = 'cuda_memory_reserved_bytes'")["rows"]
    assert cuda[0][0] > 12 * GIB


def test_a_run_of_the_usual_ending_is_not_stuck_and_a_rare_one_is(stack) -> None:
    _settings, decisions = stack
    acted = _acted(decisions, until=lambda f: "stuck" in f.get("stuck-episode", set()))
    assert acted["stuck-episode"] == {"stuck"}
    alert = next(d.detail for d in decisions.items if d.policy_name == "stuck-episode"
                 and d.decision in ACTED)
    assert "alert Agent_stuck_episode_stuck_collision_at_3_4_" in alert
    run = int(alert.split("collision_at_3_4_")[1].split("x")[0])
    assert 3 <= run <= 5  # the run it saw, not the parameter


def test_a_degraded_card_snapshots_every_worker_on_it(stack) -> None:
    _settings, decisions = stack
    acted = _acted(decisions, until=lambda f: {"hot-reporter", "hot-quiet"} <= f.get(
        "gpu-degradation-snapshot", set()))
    assert acted["gpu-degradation-snapshot"] == {"hot-reporter", "hot-quiet"}


def test_a_for_policy_over_features_from_two_sample_kinds_fires(stack) -> None:
    _settings, decisions = stack
    _acted(decisions, until=lambda f: "mixed" in f.get("hot-and-slow", set()))
    records = [d for d in decisions.items if d.policy_name == "hot-and-slow"
               and d.identity is not None]
    assert len(records) <= 3  # fired, and a cooldown noted once: no stream of resets


def test_a_variance_jump_among_slow_episodes_is_seen_in_a_few_episodes(stack) -> None:
    settings, decisions = stack
    _acted(decisions, until=lambda f: "slow" in f.get("reward-variance-jump", set()))
    rows = query(settings, """
        SELECT count() FROM features WHERE worker_id = 'slow'
          AND feature = 'reward_variance_jump_ratio'""")["rows"]
    assert rows[0][0] == 0  # 35 episodes: the episode windows never even filled


def test_policy_test_against_history_shows_what_a_policy_would_have_fired(stack) -> None:
    settings, decisions = stack
    _acted(decisions, until=lambda f: "stuck" in f.get("stuck-episode", set()))
    from dsec.cli import app

    # its six messages' feature events, stored
    wait_for(lambda: query(settings, "SELECT count() FROM features WHERE worker_id = 'stuck' "
                                     "AND feature = 'episode_end_streak_chance_per_h'")
             ["rows"][0][0] >= 6, 60, what="the stuck worker's stored features")
    policy = Path(__file__).parents[2] / "policy_engine" / "builtin" / "stuck-episode.yaml"
    env = {"DSEC_DATA_DIR": str(settings.data_dir)}
    started = time.monotonic()
    result = CliRunner().invoke(app, ["policy", "test", str(policy), "--against-history",
                                      "--since", "3h", "--job", "detect", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    fired = {r["worker_id"] for r in rows if r["decision"] == "fired"}
    assert fired == {"stuck"}, rows
    assert time.monotonic() - started < 60


def _beat(worker_id: str, t_ms: int) -> bytes:
    """A heartbeat alone, each second of the worker's time, as a probe sends it."""
    return orjson.dumps({
        "schema_version": SCHEMA_VERSION, "event_id": f"{worker_id}-{t_ms}",
        "event_time_ms": t_ms, "gpu_uuid": None,
        "identity": {"job_id": "beats", "worker_id": worker_id, "node_id": "node-2"},
        "columns": {"heartbeat": {"event_time_ms": [t_ms], "interval_s": [1.0]}}})


def test_nobody_is_lost_while_nothing_arrives_and_the_silent_one_is_once_others_go_on(
        stack) -> None:
    settings, decisions = stack
    producer = make_producer(settings, "test-detection-beats")
    topic = topic_names(settings.topic_prefix).metrics
    workers = ("beat-0", "beat-1", "beat-2")

    def send(senders: tuple[str, ...]) -> None:
        t_ms = now_ms()
        for worker in senders:
            producer.produce(topic, key=worker.encode(), value=_beat(worker, t_ms))
        assert producer.flush(30) == 0

    def lost() -> set[str]:
        return {d.identity.worker_id for d in decisions.drain()
                if d.policy_name == "worker-lost" and d.identity is not None
                and d.identity.worker_id in workers and d.decision in ACTED}

    for _ in range(3):
        send(workers)
        time.sleep(1.0)
    wait_for(lambda: query(settings, "SELECT uniqExact(worker_id) FROM features "
                                     "WHERE job_id = 'beats' AND feature = 'worker_lost'")
             ["rows"][0][0] == 3, 60, what="the heartbeats' features")
    send(workers)  # the silence starts now, however long the store took
    # Silence from everyone, 4 times past the 3 s timeout and its grace, well within the
    # 60 s stall limit: an input stall.
    time.sleep(12.0)
    assert lost() == set()
    # Two go on; the third stays silent and is lost.
    started = time.monotonic()
    while "beat-2" not in lost() and time.monotonic() - started < 60:
        send(workers[:2])
        time.sleep(1.0)
    assert lost() == {"beat-2"}
