"""A real single-node Apache Kafka broker (KRaft) assembled from Maven Central.

The jars are resolved once with Maven into a cache folder; each broker gets its
own data folder, formatted storage and loopback ports (chosen or free). With ``auth``
every client authenticates with SASL/SCRAM-SHA-512 and the KRaft ``StandardAuthorizer``
allows it only what its ACLs say (the admin, a super user, excepted).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

KAFKA_VERSION = "4.1.1"
_PR_SET_PDEATHSIG = 1


class KafkaLocalError(RuntimeError):
    """The local broker could not be assembled or started; ``log_path`` says why."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message if log_path is None else f"{message} (see {log_path})")
        self.log_path = log_path


def default_cache_dir() -> Path:
    base = os.environ.get("DSEC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsec"
    )
    return Path(base) / f"kafka-{KAFKA_VERSION}"


def _pom_path() -> Path:
    return Path(str(resources.files("dsec.infra").joinpath("kafka", "pom.xml")))


def _log4j_config_path() -> Path:
    return Path(str(resources.files("dsec.infra").joinpath("kafka", "log4j2.properties")))


def fetch_jars(cache_dir: Path | None = None) -> Path:
    """Resolve the broker's runtime jars with Maven; quick when already cached."""
    lib_dir = (cache_dir or default_cache_dir()) / "lib"
    marker = lib_dir / ".complete"
    if marker.exists():
        return lib_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError("Maven (mvn) is needed to fetch the Kafka broker jars")
    lib_dir.mkdir(parents=True, exist_ok=True)
    command = [
        mvn, "-q", "-B", "-f", str(_pom_path()),
        "dependency:copy-dependencies", "-DincludeScope=runtime",
        f"-Dkafka.version={KAFKA_VERSION}", f"-DoutputDirectory={lib_dir}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KafkaLocalError(f"mvn failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    marker.write_text(KAFKA_VERSION)
    return lib_dir


def free_port(consecutive: int = 1) -> int:
    """A loopback port free now, followed by ``consecutive - 1`` more free ones."""
    for _ in range(100):
        with contextlib.ExitStack() as bound:
            first = bound.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                for offset in range(1, consecutive):
                    other = bound.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    other.bind(("127.0.0.1", port + offset))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no {consecutive} consecutive free ports found")


def die_with_parent() -> None:
    """Runs in the child before exec: the broker ends when its parent does."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class BrokerAuth:
    """SASL on both listeners and ACLs enforced. The client listener takes SCRAM-SHA-512
    (the admin's credential is written at format, the others' through the Admin API);
    the controller listener takes PLAIN, which KRaft supports there and SCRAM is not."""

    admin_user: str = "admin"
    admin_password: str = field(default_factory=lambda: secrets.token_hex(16))

    def client(self, username: str, password: str) -> dict[str, str]:
        """librdkafka settings for a user of this broker."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": username, "sasl.password": password}

    def admin(self) -> dict[str, str]:
        return self.client(self.admin_user, self.admin_password)

    def properties(self) -> dict[str, str]:
        user, password = self.admin_user, self.admin_password
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return {
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT",
            "listener.name.client.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.client.scram-sha-512.sasl.jaas.config":
                f'{scram} required username="{user}" password="{password}";',
            "listener.name.controller.plain.sasl.jaas.config":
                f'{plain} required username="{user}" password="{password}" '
                f'user_{user}="{password}";',
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{user}",
        }

    def format_arguments(self) -> list[str]:
        return ["--add-scram",
                f"SCRAM-SHA-512=[name={self.admin_user},password={self.admin_password}]"]


@dataclass
class LocalKafka:
    """One KRaft broker+controller on loopback; ``start()`` returns the bootstrap."""

    data_dir: Path
    port: int = 0
    controller_port: int = 0
    heap_mb: int = 768
    start_timeout_s: float = 90.0
    cache_dir: Path | None = None
    auth: BrokerAuth | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        log_dir = self.data_dir / "log"
        listener = "CLIENT" if self.auth is not None else "PLAINTEXT"
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"{listener}://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(log_dir),
            "num.partitions": "3",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            **(self.auth.properties() if self.auth is not None else {}),
        }
        config_path = self.data_dir / "server.properties"
        config_path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        return config_path

    def _java_command(self, lib_dir: Path, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaLocalError("Java 17+ is needed to run the Kafka broker")
        return [
            java, f"-Xms{min(self.heap_mb, 512)}m", f"-Xmx{self.heap_mb}m",
            "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={_log4j_config_path()}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp", f"{lib_dir}/*", *args,
        ]

    def start(self) -> str:
        lib_dir = fetch_jars(self.cache_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        if not self.controller_port:
            self.controller_port = free_port()
        config_path = self._write_config()
        formatted = (self.data_dir / "log" / "meta.properties").exists()
        if not formatted:
            cluster_id = uuid.uuid4().hex[:22]
            fmt = subprocess.run(
                self._java_command(lib_dir, "kafka.tools.StorageTool", "format",
                                   "-t", cluster_id, "-c", str(config_path),
                                   *(self.auth.format_arguments() if self.auth else [])),
                capture_output=True, text=True, check=False,
            )
            if fmt.returncode != 0:
                raise KafkaLocalError(f"storage format failed: {fmt.stdout}{fmt.stderr}")
        console = self.data_dir / "broker.out"
        with console.open("ab") as out:
            self._process = subprocess.Popen(
                self._java_command(lib_dir, "kafka.Kafka", str(config_path)),
                stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
            )
        self._wait_ready(console)
        return self.bootstrap

    def _wait_ready(self, console: Path) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise KafkaLocalError("broker exited during start", console)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                admin = AdminClient(self.client_config())
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except Exception:
                pass
            time.sleep(0.2)
        self.stop()
        raise KafkaLocalError(f"broker not ready after {self.start_timeout_s} s", console)

    def client_config(self) -> dict[str, str]:
        """librdkafka settings that reach this broker (as its admin, with ``auth``)."""
        return {"bootstrap.servers": self.bootstrap,
                **(self.auth.admin() if self.auth is not None else {})}

    def stop(self, timeout_s: float = 20.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """Stops the broker at once, as a crash would."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
