"""Several local KRaft nodes, each broker and controller, joined into one cluster.

Every node votes in the metadata quorum, so a cluster of three keeps a controller and
accepts writes (``min.insync.replicas`` 2) with any one node down. Nodes are killed and
restarted one at a time to test that; a restarted node keeps its data folder and rejoins.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from dsec.infra.kafka_local import LocalKafka, free_port


class ClusterNotReadyError(RuntimeError):
    """The cluster did not reach the state waited for in time; ``state`` says where it was."""

    def __init__(self, what: str, state: object) -> None:
        super().__init__(f"{what}; last seen: {state}")
        self.state = state


@dataclass
class LocalKafkaCluster:
    """``brokers`` nodes on loopback, node ids 1..brokers; ``start()`` returns the bootstrap."""

    data_dir: Path
    brokers: int = 3
    heap_mb: int = 384
    start_timeout_s: float = 180.0
    cache_dir: Path | None = None
    nodes: dict[int, LocalKafka] = field(default_factory=dict, init=False)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def _free_ports(self, count: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < count:
            port = free_port()
            if port not in ports:
                ports.append(port)
        return ports

    def start(self) -> str:
        ports = self._free_ports(2 * self.brokers)
        client_ports, controller_ports = ports[: self.brokers], ports[self.brokers:]
        ids = range(1, self.brokers + 1)
        voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in zip(ids, controller_ports,
                                                                       strict=True))
        cluster_id = uuid.uuid4().hex[:22]
        for i, port, controller_port in zip(ids, client_ports, controller_ports, strict=True):
            self.nodes[i] = LocalKafka(
                data_dir=self.data_dir / f"node-{i}", port=port, controller_port=controller_port,
                heap_mb=self.heap_mb, start_timeout_s=self.start_timeout_s,
                cache_dir=self.cache_dir, node_id=i, quorum_voters=voters,
                cluster_id=cluster_id, internal_replicas=min(3, self.brokers))
        try:
            for node in self.nodes.values():
                node.launch()
            for node in self.nodes.values():
                node.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def kill(self, node_id: int) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        self.nodes[node_id].kill()

    def restart(self, node_id: int) -> None:
        """Starts a stopped node again on its ports and data; returns once it serves."""
        self.nodes[node_id].start()

    def running(self) -> list[int]:
        return [i for i, node in self.nodes.items() if node.pid is not None]

    def active_controller(self) -> int | None:
        """The quorum leader, as the running nodes last recorded it (highest epoch wins)."""
        best: tuple[int, int] | None = None
        for i in self.running():
            path = self.nodes[i].data_dir / "log" / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader > 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        return None if best is None else best[0]

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        running = [self.nodes[i].bootstrap for i in self.running()]
        return AdminClient({"bootstrap.servers": ",".join(running)})

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the node leading it (-1 while it has none)."""
        metadata = self._admin().list_topics(topic, timeout=10)
        return {p: meta.leader for p, meta in metadata.topics[topic].partitions.items()}

    def wait_in_sync(self, topics: list[str], timeout_s: float = 120.0) -> float:
        """Waits until every partition of ``topics`` has a leader and all its replicas in
        sync (a restarted node caught up); returns the seconds it took."""
        started = time.monotonic()
        state: object = None
        while time.monotonic() - started < timeout_s:
            try:
                metadata = self._admin().list_topics(timeout=5)
                lagging = [
                    (topic, p) for topic in topics
                    for p, meta in metadata.topics[topic].partitions.items()
                    if meta.leader < 0 or sorted(meta.isrs) != sorted(meta.replicas)
                ]
            except Exception as exc:  # a node still starting answers with errors
                lagging, state = [("?", -1)], repr(exc)
            if not lagging:
                return time.monotonic() - started
            state = lagging if lagging != [("?", -1)] else state
            time.sleep(0.5)
        raise ClusterNotReadyError(f"replicas not in sync after {timeout_s} s", state)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def __enter__(self) -> LocalKafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
