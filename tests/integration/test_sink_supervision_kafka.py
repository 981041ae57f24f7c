"""The sink's loop on the real broker and chDB, dying on a store that lost a table: a
supervisor starts it again, ``/healthz`` answers 503 while it is down, and once the table
is back the loop runs and stores what waited (issue 24: a loop that died stayed dead)."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from helpers import wait_for
from hostile_inputs import episodes, publish

from dsec.infra.kafka_clients import consumer_config, producer_config
from dsec.infra.observability import ProcessMetrics
from dsec.infra.observability.server import MetricsServer
from dsec.infra.store.clickhouse import connect, ensure_schema
from dsec.infra.store.sink import ClickHouseSink
from dsec.infra.topics import ensure_topics
from dsec.schemas import topic_names

pytestmark = pytest.mark.integration


def test_a_dead_sink_loop_is_restarted_and_unhealthy_until_it_runs(settings, tmp_path) -> None:
    topics = topic_names(settings.topic_prefix)
    ensure_topics(settings, partitions=1)
    client, lock = connect(f"chdb://{tmp_path / 'store'}"), threading.Lock()
    ensure_schema(client)
    client.command("DROP TABLE sink_offsets")  # where the sink reads its starting offsets
    publish(settings, topics.metrics, [(b"patient", episodes("patient", i)) for i in range(5)])
    metrics = ProcessMetrics()
    server = MetricsServer(metrics).start()
    sink = ClickHouseSink(client, lock, consumer_config(settings, f"sink-{uuid.uuid4().hex[:6]}"),
                          topics, producer_config(settings, "test-sink"), metrics=metrics,
                          restart_delay_s=0.2)
    sink.start()

    def health() -> httpx.Response:
        return httpx.get(f"{server.url}/healthz", timeout=5)

    def restarted_and_down() -> httpx.Response | None:
        answer = health()
        return answer if answer.status_code == 503 and sink.counters.loop_restarts >= 2 else None

    try:
        down = wait_for(restarted_and_down, 60, what="the sink restarted and reported down")
        assert "died" in down.json()["checks"]["clickhouse-sink"], down.json()
        with lock:
            ensure_schema(client)
        wait_for(lambda: health().status_code == 200, 90, what="the sink healthy again")

        def stored() -> int:
            with lock:
                return client.query("SELECT count() FROM raw_episode "
                                    "WHERE worker_id = 'patient'").result_rows[0][0]

        wait_for(lambda: stored() == 15, 60, what="the batches that waited stored")
    finally:
        sink.stop()
        server.stop()
        client.close()  # chDB holds one store per process: let the next test open its own
