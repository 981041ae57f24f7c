"""Light synthetic workers publishing probe-shaped batches in real time, for the fault and
soak benchmarks: many workers per process, each flushing once per ``flush_interval_s``
with its heartbeat, step samples, episodes, gradient syncs and a GPU reading (built from
``dsec.bench.traces``). Every batch has an id of its own, so that what the store holds can
be matched with what the broker acknowledged.

Workers may also be attached to their node's actuator (``attach``): each registers on the
node's socket as a worker would and takes its commands at its flushes, as at a step
boundary. A synthetic worker has nothing to save, so its snapshot hook only answers; it
has no other hook, and answers every other action ``unsupported``.

Run as a process (``python -m dsec.bench.live_load``) it reads the broker, topic prefix
and run folder from the environment (``DSEC_BOOTSTRAP``, ``DSEC_TOPIC_PREFIX``,
``DSEC_RUN_DIR``) and prints its counters as one JSON line when it ends.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field, replace

from dsec.actuators import ApplyHooks, WorkerChannel
from dsec.actuators.channel import socket_path
from dsec.bench.traces import TraceIdentity, grad_norm_decay, reward_variance_jump, slow_grad_sync
from dsec.infra.kafka_clients import make_producer
from dsec.schemas import ActionKind, MetricBatch, now_ms, topic_names
from dsec.schemas.metrics import encode_packed
from dsec.schemas.settings import DsecSettings

# As the probe's own default (ProbeConfig.message_timeout_s): a batch is retried for five
# minutes, far longer than a leader election, before it counts as failed.
MESSAGE_TIMEOUT_MS = 300_000


@dataclass(frozen=True)
class LoadProfile:
    """What one worker sends each flush."""

    flush_interval_s: float = 1.0
    steps_per_flush: int = 5
    episodes_per_flush: int = 1
    syncs_per_flush: int = 2

    @property
    def samples_per_flush(self) -> int:
        # and one heartbeat and one GPU reading
        return self.steps_per_flush + self.episodes_per_flush + self.syncs_per_flush + 2


def flush_batch(ident: TraceIdentity, index: int, profile: LoadProfile,
                at_ms: int) -> MetricBatch:
    """Worker ``ident``'s ``index``-th flush, its samples in the second before ``at_ms``."""
    ident = replace(ident, start_ms=at_ms - 1000)
    sync = slow_grad_sync(ident, 1, latency_ms=20.0, syncs_per_s=profile.syncs_per_flush,
                          heartbeat_interval_s=profile.flush_interval_s)[0]
    steps = grad_norm_decay(ident, -1e-4, profile.steps_per_flush,
                            steps_per_s=profile.steps_per_flush)[0]
    episodes = reward_variance_jump(ident, 1 << 30, profile.episodes_per_flush,
                                    episodes_per_s=profile.episodes_per_flush, seed=index)[0]
    columns = sync.columns.model_copy(update={"step": steps.columns.step,
                                              "episode": episodes.columns.episode})
    return sync.model_copy(update={"event_id": f"{ident.worker_id}-{index:08d}",
                                   "columns": columns})


def batch_key(batch: MetricBatch) -> str:
    """A flush batch as the store names it: its worker and its heartbeat's time (a stored
    row does not carry its message's id; every flush holds one heartbeat)."""
    heartbeat = batch.columns.heartbeat if batch.columns is not None else None
    if heartbeat is None or len(heartbeat.event_time_ms) != 1:
        raise ValueError("a flush batch holds one heartbeat")
    return f"{batch.identity.worker_id}@{heartbeat.event_time_ms[0]}"


def worker_identities(job_id: str, first: int, count: int, nodes: int) -> list[TraceIdentity]:
    """Workers ``first`` .. ``first + count - 1``, spread over ``nodes`` nodes."""
    return [TraceIdentity(job_id=job_id, worker_id=f"worker-{i:05d}",
                          node_id=f"node-{i % nodes:02d}",
                          gpu_uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000")
            for i in range(first, first + count)]


@dataclass
class LoadCounters:
    produced_batches: int = 0
    acked_batches: int = 0
    failed_batches: int = 0
    acked_samples: int = 0
    # each acknowledged batch as the store names it: ``batch_key``
    acked_keys: set[str] = field(default_factory=set)

    def summary(self) -> dict[str, int]:
        return {"produced_batches": self.produced_batches, "acked_batches": self.acked_batches,
                "failed_batches": self.failed_batches, "acked_samples": self.acked_samples}


class LiveLoad:
    """Publishes for ``workers`` on a thread of its own until ``stop()``; each worker's
    flushes are spread over the interval, as independent probes' are."""

    def __init__(self, settings: DsecSettings, workers: list[TraceIdentity],
                 profile: LoadProfile, attach: frozenset[str] = frozenset()) -> None:
        self._settings = settings
        self._workers = workers
        self._profile = profile
        self._attach = attach
        self._channels: dict[str, WorkerChannel] = {}
        self._topic = topic_names(settings.topic_prefix).metrics
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.counters = LoadCounters()
        self._thread = threading.Thread(target=self._run, name="dsec-live-load", daemon=True)

    def start(self) -> LiveLoad:
        for ident in self._workers:
            if ident.worker_id in self._attach:
                hooks = ApplyHooks()
                hooks.register(ActionKind.SNAPSHOT, lambda _params: "synthetic: nothing to save")
                path = socket_path(self._settings.run_directory(), ident.node_id)
                self._channels[ident.worker_id] = WorkerChannel(ident.worker(), path,
                                                                hooks).start(0.0)
        self._thread.start()
        return self

    def answers(self) -> dict[str, int]:
        """What the attached workers answered, by status."""
        totals: dict[str, int] = {}
        for channel in self._channels.values():
            for status, count in channel.results.items():
                totals[status.value] = totals.get(status.value, 0) + count
        return totals

    def snapshot(self) -> LoadCounters:
        with self._lock:
            return replace(self.counters, acked_keys=set(self.counters.acked_keys))

    def _delivered(self, err: object, key: str) -> None:
        with self._lock:
            if err is not None:
                self.counters.failed_batches += 1
                return
            self.counters.acked_batches += 1
            self.counters.acked_samples += self._profile.samples_per_flush
            self.counters.acked_keys.add(key)

    def _run(self) -> None:
        producer = make_producer(self._settings, "dsec-live-load",
                                 **{"message.timeout.ms": MESSAGE_TIMEOUT_MS})
        interval_s = self._profile.flush_interval_s
        gap_s = interval_s / max(1, len(self._workers))
        started = time.monotonic()
        index = 0
        while not self._stop.is_set():
            for j, ident in enumerate(self._workers):
                wait_s = started + index * interval_s + j * gap_s - time.monotonic()
                if wait_s > 0 and self._stop.wait(wait_s):
                    break
                batch = flush_batch(ident, index, self._profile, now_ms())
                stored_as = batch_key(batch)
                producer.produce(
                    self._topic, key=ident.worker_id.encode(), value=encode_packed(batch),
                    on_delivery=lambda err, _msg, key=stored_as: self._delivered(err, key))
                with self._lock:
                    self.counters.produced_batches += 1
                producer.poll(0)
                channel = self._channels.get(ident.worker_id)
                if channel is not None:
                    channel.apply_pending()
            index += 1
        producer.flush(MESSAGE_TIMEOUT_MS / 1000)
        for channel in self._channels.values():
            channel.stop()

    def stop(self, timeout_s: float = 330.0) -> LoadCounters:
        """Stops publishing and waits for every acknowledgement (or failure)."""
        self._stop.set()
        self._thread.join(timeout_s)
        return self.snapshot()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--duration-s", type=float, required=True)
    parser.add_argument("--flush-interval-s", type=float, default=5.0)
    parser.add_argument("--steps-per-flush", type=int, default=25)
    parser.add_argument("--episodes-per-flush", type=int, default=5)
    parser.add_argument("--syncs-per-flush", type=int, default=5)
    parser.add_argument("--attach-per-node", type=int, default=0,
                        help="Workers of each node registered on its node actuator.")
    args = parser.parse_args()
    settings = DsecSettings()
    profile = LoadProfile(args.flush_interval_s, args.steps_per_flush,
                          args.episodes_per_flush, args.syncs_per_flush)
    workers = worker_identities(settings.job_id, args.first, args.workers, args.nodes)
    per_node: dict[str, list[str]] = {}
    for ident in workers:
        per_node.setdefault(ident.node_id, []).append(ident.worker_id)
    attach = frozenset(w for ids in per_node.values() for w in ids[:args.attach_per_node])
    load = LiveLoad(settings, workers, profile, attach).start()
    time.sleep(args.duration_s)
    counters = load.stop().summary()
    print(json.dumps({**counters, "attached_workers": len(attach),
                      **{f"answered_{k}": v for k, v in load.answers().items()}}), flush=True)


if __name__ == "__main__":
    main()
