"""Session fixtures: one real Kafka broker for the whole run, chDB in temporary folders.

The broker is ``DSEC_TEST_BOOTSTRAP`` when set, else a testcontainers Kafka when a
Docker engine answers, else the project's own KRaft broker from the Maven jars.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_for

from dsec.schemas.settings import DsecSettings


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session", autouse=True)
def _metrics_endpoints_off() -> Iterator[None]:
    """Services the tests start serve no metrics unless a test gives them a free port: the
    default port is fixed, and stacks run side by side here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DSEC_METRICS_PORT", "0")
        yield


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("DSEC_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from dsec.infra.kafka_local import LocalKafka

    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> DsecSettings:
    """Settings on the session broker, with topics of this test's own."""
    return DsecSettings(
        bootstrap=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        job_id="test-job",
        data_dir=tmp_path / "dsec",
    )


@pytest.fixture(scope="module")
def running_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    """``dsec up`` on the session broker (stream jobs, policy engine, sink), in its own process,
    with topics and a store of this module's own."""
    import signal
    import subprocess
    import sys

    from dsec.services.stack import read_stack_state

    data_dir = tmp_path_factory.mktemp("stack")
    stack_settings = DsecSettings(
        bootstrap=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        job_id="test-job",
        data_dir=data_dir,
    )
    env = {
        **os.environ,
        "DSEC_DATA_DIR": str(data_dir),
        "DSEC_TOPIC_PREFIX": stack_settings.topic_prefix,
        "DSEC_STREAM_SESSION_TIMEOUT_S": "10",
    }
    log_path = data_dir / "stack.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "dsec.cli", "up", "--bootstrap", kafka_bootstrap],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: process.poll() is not None or read_stack_state(data_dir), 120,
                 what="the stack to start")
        assert process.poll() is None, log_path.read_text()[-4000:]
        yield stack_settings
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
