"""The deployment files, checked with the real tools: hadolint for the image, Docker Compose
for the compose stack, Helm and the Kubernetes schemas for the chart, chDB for the
dashboards' SQL. Helm and Compose are built from their Go modules by infra/tools/ (once,
cached in ~/.cache/dsec/tools; ``make setup`` does it before the tests)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click
import kubernetes_validate
import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from dsec.cli import app
from dsec.infra.observability import METRIC_NAMES
from dsec.infra.store.clickhouse import RAW_TABLES, TABLES, connect, ensure_schema

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
COMPOSE_FILE = INFRA / "compose" / "compose.yaml"
CHART = INFRA / "helm" / "dsec"
CHART_VALUES = sorted((CHART / "ci").glob("*.yaml"))
DASHBOARDS = INFRA / "grafana" / "dashboards"
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
COMPOSE_SECRETS = {"DSEC_SIGNING_KEY": "compose-test-key", "DSEC_GATEWAY_TOKEN": "compose-token",
                   "CLICKHOUSE_PASSWORD": "compose-password"}
DSEC_COMPOSE_SERVICES = {"init", "stream-jobs", "policy-engine", "sink", "ingest-gateway",
                         "actuator"}
DSEC_WORKLOADS = {"stream-jobs", "policy-engine", "sink", "ingest-gateway", "actuator"}
# Room for building Helm or Compose inside a fixture when `make tools` did not run first.
pytestmark = pytest.mark.timeout(1800)

# The Prometheus metrics every dsec service exports (names without the histogram suffixes).
METRIC_CATALOGUE = set(METRIC_NAMES)


def _tool(script: str) -> str:
    """The path a script under infra/tools/ prints, building the tool the first time."""
    result = subprocess.run(["bash", str(INFRA / "tools" / script)], capture_output=True,
                            text=True, timeout=3600, check=False)
    if result.returncode != 0:
        pytest.fail(f"infra/tools/{script} failed:\n{result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def helm() -> str:
    return _tool("helm.sh")


@pytest.fixture(scope="session")
def docker_compose() -> str:
    return _tool("docker-compose.sh")


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool.sh")


def _parse_dsec_command(args: list[str]) -> click.Context:
    """Parses a dsec command line as the CLI does (options, types, bounds) without running it."""
    command: click.Command = typer.main.get_command(app)
    rest = list(args)
    while isinstance(command, click.Group):
        assert rest, f"no subcommand in {args}"
        name, rest = rest[0], rest[1:]
        sub = command.get_command(click.Context(command), name)
        assert sub is not None, f"dsec has no command {name!r} ({args})"
        command = sub
    return command.make_context(command.name or "dsec", rest)


# ---- the image -------------------------------------------------------------------------

def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style",
                             str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_holds_every_package_folder_and_runs_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    # dsec/ and the layer folders it links to (dsec/schemas -> schemas/, ...)
    package_dirs = {"dsec"} | {
        path.resolve().relative_to(REPO).as_posix()
        for path in (REPO / "dsec").iterdir() if path.is_symlink()
    }
    copied = {m[1] for m in re.finditer(r"^COPY (\S+) \./\S+$", text, flags=re.M)}
    assert package_dirs <= copied, f"the image misses {package_dirs - copied}"
    assert re.search(r"^COPY pyproject\.toml README\.md \./$", text, flags=re.M)
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert not ignored & (package_dirs | {"pyproject.toml", "README.md"})
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users and users[-1] == "${DSEC_UID}:${DSEC_UID}"
    assert int(re.search(r"^ARG DSEC_UID=(\d+)$", text, flags=re.M)[1]) >= 1000
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text
    assert re.search(r'^\s+CMD \["dsec", "health"\]$', text, flags=re.M)
    assert re.search(r'^ENTRYPOINT \["dsec"\]$', text, flags=re.M)


# ---- docker compose ----------------------------------------------------------------------

def _compose(docker_compose: str, *args: str, env: dict[str, str] | None = None):
    environment = {k: v for k, v in os.environ.items() if k not in COMPOSE_SECRETS}
    environment.update(env if env is not None else COMPOSE_SECRETS)
    # An empty env file: a developer's infra/compose/.env must not answer for the test.
    return subprocess.run([docker_compose, "-f", str(COMPOSE_FILE), "--env-file", os.devnull,
                           *args], capture_output=True, text=True, env=environment, timeout=120,
                          check=False)


def test_compose_file_validates(docker_compose: str) -> None:
    for profile in ((), ("--profile", "observability")):
        result = _compose(docker_compose, *profile, "config", "--quiet")
        assert result.returncode == 0, result.stderr
    result = _compose(docker_compose, "--profile", "observability", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    project = json.loads(result.stdout)
    services = project["services"]
    assert set(services) == DSEC_COMPOSE_SERVICES | {"kafka", "clickhouse", "prometheus",
                                                    "grafana"}
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert {"kafka-data", "clickhouse-data", "dsec-run"} <= set(project["volumes"])
    init = services["init"]
    assert init["command"][0] == "init"
    assert {name: dep["condition"] for name, dep in init["depends_on"].items()} == {
        "kafka": "service_healthy", "clickhouse": "service_healthy"}
    for name in DSEC_COMPOSE_SERVICES:
        service = services[name]
        _parse_dsec_command(service["command"])
        env = service["environment"]
        assert env["DSEC_SIGNING_KEY"] == COMPOSE_SECRETS["DSEC_SIGNING_KEY"]
        assert env["DSEC_CLICKHOUSE_DSN"].startswith("http://dsec:compose-password@clickhouse:")
        assert env["DSEC_METRICS_HOST"] == "0.0.0.0"
        if name == "init":
            continue
        assert service["depends_on"]["init"]["condition"] == "service_completed_successfully"
        assert service["healthcheck"]["test"] == ["CMD", "dsec", "health"]
    assert services["ingest-gateway"]["environment"]["DSEC_GATEWAY_TOKEN"] == "compose-token"
    actuator = services["actuator"]
    assert actuator["environment"]["DSEC_RUN_DIR"] == "/run/dsec"
    assert any(v["source"] == "dsec-run" and v["target"] == "/run/dsec"
               for v in actuator["volumes"])
    assert [c["command"][3:5] for c in (services[s] for s in ("stream-jobs", "policy-engine",
                                                              "sink"))] == [
        ["--services", "stream-jobs"], ["--services", "policy-engine,alert-notifier"],
        ["--services", "sink"]]


def _kafka_image_properties(environment: dict[str, str]) -> dict[str, str]:
    """The broker settings the apache/kafka image makes of KAFKA_* variables (KAFKA_FOO_BAR
    is foo.bar; ``__`` stands for ``_`` and ``___`` for ``-``)."""
    not_settings = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS",
                    "KAFKA_LOG4J_OPTS", "KAFKA_JMX_OPTS"}
    return {
        name[len("KAFKA_"):].lower().replace("___", "-").replace("__", "\0")
        .replace("_", ".").replace("\0", "_"): str(value)
        for name, value in environment.items()
        if name.startswith("KAFKA_") and name not in not_settings
    }


@pytest.mark.integration
def test_compose_broker_settings_start_kafka(docker_compose: str, tmp_path: Path) -> None:
    """The compose file's KRaft settings, moved onto loopback ports, run Kafka 4.1.1 (the
    image's version, from the same jars as the tests' broker), and dsec init works on it."""
    import base64

    from dsec.infra.kafka_local import LocalKafka, free_port

    result = _compose(docker_compose, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    kafka = json.loads(result.stdout)["services"]["kafka"]
    assert len(base64.urlsafe_b64decode(kafka["environment"]["CLUSTER_ID"] + "==")) == 16
    settings = _kafka_image_properties(kafka["environment"])
    host_port = free_port()

    class ComposeBroker(LocalKafka):
        def _write_config(self) -> Path:
            moved = {"kafka:9092": f"127.0.0.1:{self.port}", ":9092": f"127.0.0.1:{self.port}",
                     "kafka:9093": f"127.0.0.1:{self.controller_port}",
                     ":9093": f"127.0.0.1:{self.controller_port}",
                     "localhost:29092": f"127.0.0.1:{host_port}",
                     ":29092": f"127.0.0.1:{host_port}"}
            properties = dict(settings, **{"log.dirs": str(self.data_dir / "log")})
            for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
                properties[key] = re.sub(r"(kafka|localhost)?:(9092|9093|29092)\b",
                                         lambda m: moved[m[0]], properties[key])
            path = self.data_dir / "server.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            return path

    broker = ComposeBroker(data_dir=tmp_path / "kafka")
    broker.start()
    try:
        env = {"DSEC_TOPIC_PREFIX": "compose", "DSEC_DATA_DIR": str(tmp_path / "dsec"),
               "DSEC_CLICKHOUSE_DSN": ""}
        for bootstrap in (broker.bootstrap, f"127.0.0.1:{host_port}"):
            init = CliRunner().invoke(app, ["init", "--bootstrap", bootstrap, "--partitions",
                                            "2", "--wait-s", "30"], env=env)
            assert init.exit_code == 0, init.output
    finally:
        broker.stop()
    assert settings["process.roles"] == "broker,controller"
    assert settings["auto.create.topics.enable"] == "false"


def test_compose_refuses_to_start_without_its_secrets(docker_compose: str) -> None:
    result = _compose(docker_compose, "config", "--quiet",
                      env={k: v for k, v in COMPOSE_SECRETS.items() if k != "DSEC_SIGNING_KEY"})
    assert result.returncode != 0
    assert "DSEC_SIGNING_KEY" in result.stderr


# ---- the Helm chart ----------------------------------------------------------------------

def _render(helm: str, values: Path | None = None, *extra: str) -> list[dict]:
    args = [helm, "template", "dsec", str(CHART), "--namespace", "training", *extra]
    if values is not None:
        args += ["--values", str(values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _workloads(objects: list[dict]) -> dict[str, dict]:
    return {obj["metadata"]["labels"]["app.kubernetes.io/component"]: obj for obj in objects
            if obj["kind"] in ("Deployment", "DaemonSet")}


def _env(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("values", [None, *CHART_VALUES],
                         ids=["default", *(p.stem for p in CHART_VALUES)])
def test_chart_renders_and_every_object_validates(helm: str, values: Path | None) -> None:
    lint = subprocess.run([helm, "lint", "--strict", str(CHART),
                           *(["--values", str(values)] if values else [])],
                          capture_output=True, text=True, timeout=120, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objects = _render(helm, values)
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert obj["kind"] == "ServiceMonitor"  # a CRD: no schema of Kubernetes' own
            continue
        if obj["apiVersion"].startswith("kafka.strimzi.io/"):
            assert obj["kind"] == "KafkaUser"  # Strimzi's CRD, checked below
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): "
                            f"{exc.message} at {'.'.join(map(str, exc.path))}")
    assert set(_workloads(objects)) == DSEC_WORKLOADS


def test_the_schema_check_catches_a_broken_object(helm: str) -> None:
    deployment = next(o for o in _render(helm) if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"][
        "pathh"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_chart_workloads_are_unprivileged_probed_sized_and_scraped(helm: str) -> None:
    objects = _render(helm, None, "--set", "streamJobs.replicas=4")
    workloads = _workloads(objects)
    assert {name: obj["kind"] for name, obj in workloads.items()} == {
        "stream-jobs": "Deployment", "policy-engine": "Deployment", "sink": "Deployment",
        "ingest-gateway": "Deployment", "actuator": "DaemonSet"}
    assert workloads["stream-jobs"]["spec"]["replicas"] == 4
    for name, obj in workloads.items():
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] >= 1000
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"]["memory"]
            assert container["resources"]["limits"]["memory"]
        dsec_init = [c for c in pod.get("initContainers", []) if c["name"] == "init"]
        for container in pod["containers"] + dsec_init:
            args = [re.sub(r"\$\((\w+)\)", "kafka:9092", arg) for arg in container["args"]]
            _parse_dsec_command(args)
            assert _env(container)["DSEC_METRICS_HOST"]["value"] == "0.0.0.0"
            assert _env(container)["DSEC_SIGNING_KEY"]["valueFrom"]["secretKeyRef"]
        if name in ("stream-jobs", "policy-engine", "sink"):
            assert [c["args"][:1] + c["args"][3:7] for c in dsec_init] == [
                ["init", "--partitions", "6", "--replication-factor", "1"]]
        for container in pod["containers"]:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in \
                container["ports"]
        annotations = obj["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "9464"
    init_containers = workloads["actuator"]["spec"]["template"]["spec"]["initContainers"]
    assert [c["securityContext"]["capabilities"]["add"] for c in init_containers] == [
        ["CHOWN", "FOWNER"]]
    gateway_service = next(o for o in objects if o["kind"] == "Service"
                           and o["metadata"]["name"] == "dsec-ingest-gateway")
    assert gateway_service["spec"]["ports"][0]["targetPort"] == "http"


def test_chart_actuator_shares_its_run_directory_with_training_pods(helm: str) -> None:
    actuator = _workloads(_render(helm))["actuator"]
    pod = actuator["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert _env(container)["DSEC_RUN_DIR"]["value"] == "/run/dsec"
    assert _env(container)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["args"][-2:] == ["--node", "$(NODE_NAME)"]
    volume = next(v for v in pod["volumes"] if v["name"] == "run-dir")
    assert volume["hostPath"] == {"path": "/var/run/dsec", "type": "DirectoryOrCreate"}
    assert {"name": "run-dir", "mountPath": "/run/dsec"} in container["volumeMounts"]


def test_chart_wires_sasl_ssl_from_its_own_secrets(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "sasl-ssl-values.yaml")
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert set(secrets["dsec"]["data"]) == {"clickhouse-dsn", "signing-key",
                                            "kafka-sasl-password", "gateway-token"}
    assert set(secrets["dsec-kafka-tls"]["data"]) == {"ca.crt"}
    stream_jobs = _workloads(objects)["stream-jobs"]
    assert stream_jobs["spec"]["replicas"] == 6
    container = stream_jobs["spec"]["template"]["spec"]["containers"][0]
    env = _env(container)
    assert env["DSEC_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["DSEC_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert env["DSEC_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "dsec", "key": "kafka-sasl-password"}
    assert env["DSEC_KAFKA_SSL_CA_LOCATION"]["value"] == "/etc/dsec/kafka-tls/ca.crt"
    assert env["DSEC_JOB_ID"]["value"] == "rl-run-7"
    init = stream_jobs["spec"]["template"]["spec"]["initContainers"][0]
    assert init["args"][3:7] == ["--partitions", "12", "--replication-factor", "3"]
    assert _env(init)["DSEC_KAFKA_SASL_PASSWORD"] == env["DSEC_KAFKA_SASL_PASSWORD"]
    assert {"name": "kafka-tls", "mountPath": "/etc/dsec/kafka-tls", "readOnly": True} in \
        container["volumeMounts"]
    policy_env = _env(_workloads(objects)["policy-engine"]["spec"]["template"]["spec"]
                      ["containers"][0])
    assert json.loads(policy_env["DSEC_POLICY_PARAMS"]["value"]) == {
        "bandwidth-latency-breaker": {"latency_cap_ms": 70}}
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 1
    metric_services = [o for o in objects if o["kind"] == "Service"
                       and o["metadata"]["labels"].get("dsec.io/metrics") == "true"]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"]
            for s in metric_services} == DSEC_WORKLOADS


def test_chart_on_strimzi_uses_existing_secrets_only(helm: str) -> None:
    objects = _render(helm, CHART / "ci" / "strimzi-values.yaml")
    assert not [o for o in objects if o["kind"] == "Secret"]
    workloads = _workloads(objects)
    for workload in workloads.values():
        pod = workload["spec"]["template"]["spec"]
        env = _env(pod["containers"][0])
        assert env["DSEC_BOOTSTRAP"]["value"] == "training-kafka-kafka-bootstrap.kafka.svc:9093"
        refs = {name: env[name]["valueFrom"]["secretKeyRef"] for name in
                ("DSEC_KAFKA_SASL_PASSWORD", "DSEC_CLICKHOUSE_DSN", "DSEC_SIGNING_KEY")}
        assert refs == {"DSEC_KAFKA_SASL_PASSWORD": {"name": "dsec", "key": "password"},
                        "DSEC_CLICKHOUSE_DSN": {"name": "dsec-clickhouse", "key": "dsn"},
                        "DSEC_SIGNING_KEY": {"name": "dsec-signing", "key": "signing-key"}}
        tls = next(v for v in pod["volumes"] if v["name"] == "kafka-tls")
        assert tls["secret"] == {"secretName": "training-kafka-cluster-ca-cert",
                                 "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    actuator_pod = workloads["actuator"]["spec"]["template"]["spec"]
    assert "initContainers" not in actuator_pod
    assert actuator_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_chart_gives_each_workload_its_own_kafka_user_and_renders_their_acls(
        helm: str) -> None:
    from dsec.infra.kafka_acls import strimzi_users

    objects = _render(helm, CHART / "ci" / "kafka-users-values.yaml")
    users = {"stream-jobs": "dsec-stream-jobs", "policy-engine": "dsec-policy-engine",
             "sink": "dsec-sink", "ingest-gateway": "dsec-gateway",
             "actuator": "dsec-node-actuator"}
    for name, workload in _workloads(objects).items():
        pod = workload["spec"]["template"]["spec"]
        dsec_init = [c for c in pod.get("initContainers", []) if c["name"] == "init"]
        for container, user in [(pod["containers"][0], users[name]),
                                *((c, "dsec-init") for c in dsec_init)]:
            names = [item["name"] for item in container["env"]]
            assert len(names) == len(set(names)), names
            env = _env(container)
            assert env["DSEC_KAFKA_SASL_USERNAME"]["value"] == user
            assert env["DSEC_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
            assert env["DSEC_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
                "name": user, "key": "password"}
    assert not [o for o in objects if o["kind"] == "Secret"]
    rendered = {o["metadata"]["name"]: o for o in objects if o["kind"] == "KafkaUser"}
    expected = {u["metadata"]["name"]: u for u in strimzi_users("rl", "training-kafka")}
    assert set(rendered) == set(expected)
    for name, user in rendered.items():
        assert user["metadata"]["namespace"] == "kafka"
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "training-kafka"
        assert user["spec"] == expected[name]["spec"]


def test_chart_keeps_a_generated_signing_key_out_of_the_values(helm: str) -> None:
    secret = next(o for o in _render(helm) if o["kind"] == "Secret")
    import base64

    key = base64.b64decode(secret["data"]["signing-key"]).decode()
    assert len(key) == 64 and key.isalnum()


# ---- Grafana -----------------------------------------------------------------------------

def _dashboard(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text())


def _targets(dashboard: dict) -> list[dict]:
    return [target for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboards_are_well_formed() -> None:
    names = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    assert names == ["fleet-health.json", "history.json", "trends.json"]
    uids = set()
    for name in names:
        dashboard = _dashboard(name)
        uids.add(dashboard["uid"])
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dashboard["panels"]:
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24
    assert len(uids) == 3


def test_fleet_dashboard_uses_the_metric_catalogue() -> None:
    used = set()
    for target in _targets(_dashboard("fleet-health.json")):
        for name in re.findall(r"\bdsec_[a-z_]+", target["expr"]):
            # a histogram's series carry _bucket, _sum and _count after its name
            used.add(name if name in METRIC_CATALOGUE
                     else re.sub(r"_(bucket|sum|count)$", "", name))
    assert used <= METRIC_CATALOGUE, f"not in the catalogue: {used - METRIC_CATALOGUE}"
    assert used == METRIC_CATALOGUE, f"no panel shows: {METRIC_CATALOGUE - used}"


def _grafana_to_clickhouse(sql: str, job: str | None) -> str:
    """What the ClickHouse data source sends for a time range of the last day and a job
    selection (None: All)."""
    until = int(time.time()) + 60  # whole seconds: rows of this very second are inside
    since = until - 86_400
    sql = re.sub(r"\$__conditionalAll\((.*?),\s*\$job\)",
                 lambda m: "1=1" if job is None else m[1], sql, flags=re.S)
    sql = sql.replace("${job:singlequote}", f"'{job}'")
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)",
                 rf"\1 >= toDateTime({since}) AND \1 <= toDateTime({until})", sql)
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)",
                 r"toStartOfInterval(toDateTime(\1), INTERVAL 60 second)", sql)
    assert "$" not in sql, sql
    return sql


def _seed_history(client) -> None:
    now = "now64(3)"
    rows = {
        "features (event_time, event_id, job_id, node_id, worker_id, gpu_uuid, window, "
        "feature, value)": [
            f"({now}, 'f1', 'job-a', 'n0', 'w0', 'g0', 'episodes', 'reward_variance', 2.5)",
            f"({now}, 'f2', 'job-a', 'n0', 'w0', 'g0', 'episodes', "
            "'reward_variance_jump_ratio', 6.0)",
            f"({now}, 'f3', 'job-a', 'n0', 'w1', 'g1', 'steps', 'grad_norm_log_slope', -0.01)",
            f"({now}, 'f4', 'job-a', 'n0', 'w1', 'g1', 'syncs', 'grad_sync_latency_p99_ms', 80)",
            f"({now}, 'f5', 'job-a', 'n0', 'w1', 'g1', 'gpu', 'gpu_memory_growth_bytes_per_s', "
            "1e6)",
            f"({now}, 'f6', 'job-a', 'n0', 'w0', 'g0', 'liveness', 'heartbeat_age_s', 1.5)",
        ],
        "actuations (event_time, actuation_id, expires_at, job_id, node_id, worker_id, "
        "policy_name, policy_version, action, params, reason)": [
            f"({now}, 'a1', {now} + 60, 'job-a', 'n0', 'w0', 'bandwidth-latency-breaker', 1, "
            "'grad_compression', '{{\"bits\": 4}}', 'latency over cap')",
            f"({now}, 'a2', {now} + 60, 'job-a', 'n0', 'w1', 'periodic-snapshot', 1, "
            "'snapshot', '{}', 'periodic')",
        ],
        "actuation_results (event_time, event_id, actuation_id, job_id, node_id, worker_id, "
        "action, status, detail, command_time)": [
            f"({now} + 0.05, 'r1', 'a1', 'job-a', 'n0', 'w0', 'grad_compression', 'applied', "
            f"'', {now})",
        ],
        "gpu_profiles (event_time, event_id, gpu_uuid, gpu_model, job_id, node_id, worker_id, "
        "regime, delta_bytes, delta_s, thermal_throttle_events, bandwidth_jitter, samples)": [
            f"({now}, 'p1', 'g0', 'A100', 'job-a', 'n0', 'w0', 'long', 1e9, 100, 2, 0.1, 50)",
            f"({now}, 'p2', 'g0', 'A100', 'job-a', 'n0', 'w0', 'short', 1e6, 100, 0, 0.1, 50)",
        ],
        "policy_decisions (event_time, event_id, policy_name, policy_version, job_id, node_id, "
        "worker_id, decision, actuation_id, detail)": [
            f"({now}, 'd1', 'bandwidth-latency-breaker', 1, 'job-a', 'n0', 'w0', 'fired', 'a1', "
            "'')",
        ],
        "dead_letters (event_time, event_id, source_topic, partition, offset, reason, payload, "
        "payload_encoding)": [
            f"({now}, 'x1', 'dsec.metrics.v1', 0, 7, 'columns.step.grad_norm: values must be "
            ">= 0', '', 'utf-8')",
        ],
    }
    for table, values in rows.items():
        client.command(f"INSERT INTO {table} VALUES {', '.join(values)}")


@pytest.mark.parametrize("name", ["history.json", "trends.json"])
def test_store_dashboard_queries_run_on_the_store(tmp_path: Path, name: str) -> None:
    client = connect(f"chdb://{tmp_path / 'clickhouse'}")
    try:
        ensure_schema(client, ttl_days=30)
        _seed_history(client)
        dashboard = _dashboard(name)
        rows_by_panel: dict[str, int] = {}
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                assert target["datasource"]["type"] == "grafana-clickhouse-datasource"
                for job in (None, "job-a"):
                    sql = _grafana_to_clickhouse(target["rawSql"], job)
                    try:
                        result = client.query(sql)
                    except Exception as exc:
                        pytest.fail(f"{panel['title']!r} (job={job}): {exc}\n{sql}")
                    rows_by_panel[panel["title"]] = len(result.result_rows)
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                jobs = [row[0] for row in client.query(variable["query"]).result_rows]
                assert jobs == ["job-a"]
    finally:
        client.close()
    empty = [title for title, count in rows_by_panel.items() if not count]
    assert not empty, f"panels with no rows over the seeded history: {empty}"


def test_prometheus_rules_pass_promtool_and_fire_on_their_tests(promtool: str) -> None:
    rules = INFRA / "prometheus" / "rules.yml"
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout
    tested = subprocess.run([promtool, "test", "rules", "rules_test.yml"],
                            cwd=rules.parent, capture_output=True, text=True, timeout=120,
                            check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    used = set(re.findall(r"\bdsec_[a-z_]+", rules.read_text()))
    assert {re.sub(r"_(bucket|sum|count)$", "", name) if name not in METRIC_CATALOGUE
            else name for name in used} <= METRIC_CATALOGUE


def test_grafana_provisioning_points_at_the_compose_services() -> None:
    provisioning = INFRA / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "dsec.yaml").read_text())
    by_type = {s["type"]: s for s in sources["datasources"]}
    assert by_type["prometheus"]["url"] == "http://prometheus:9090"
    clickhouse = by_type["grafana-clickhouse-datasource"]["jsonData"]
    assert (clickhouse["host"], clickhouse["port"], clickhouse["protocol"]) == (
        "clickhouse", 8123, "http")
    providers = yaml.safe_load((provisioning / "dashboards" / "dsec.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


# ---- dsec init ---------------------------------------------------------------------------

@pytest.mark.integration
def test_init_makes_topics_and_tables_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {"DSEC_TOPIC_PREFIX": prefix, "DSEC_DATA_DIR": str(tmp_path / "dsec"),
           "DSEC_CLICKHOUSE_DSN": ""}
    args = ["init", "--bootstrap", kafka_bootstrap, "--partitions", "3", "--wait-s", "0"]
    first = CliRunner().invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    assert f"created {prefix}." in first.output
    second = CliRunner().invoke(app, args, env=env)
    assert second.exit_code == 0, second.output
    assert "all there" in second.output
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
    assert len(topics[f"{prefix}.metrics.v1"].partitions) == 3
    client = connect(f"chdb://{(tmp_path / 'dsec' / 'clickhouse').resolve()}")
    try:
        names = {row[0] for row in client.query("SHOW TABLES").result_rows}
    finally:
        client.close()
    assert set(TABLES) | set(RAW_TABLES) | {"raw_metrics"} <= names


def test_init_gives_up_after_its_wait(tmp_path: Path) -> None:
    env = {"DSEC_DATA_DIR": str(tmp_path / "dsec"), "DSEC_CLICKHOUSE_DSN": ""}
    result = CliRunner().invoke(app, ["init", "--bootstrap", "127.0.0.1:1", "--wait-s", "0"],
                                env=env)
    assert result.exit_code == 1
    assert "init failed (topics)" in result.output
