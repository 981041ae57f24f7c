"""``dsec placement``: the recommendation API, a recommendation on the command line, the
personality job, a node's GPU topology, and Kubernetes node labels and taints."""

from __future__ import annotations

import json
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.schemas.settings import DsecSettings

placement_app = typer.Typer(no_args_is_help=True, help="Where work goes: GPU personalities, "
                                                       "affinity, health and topology.")
console = Console()
err_console = Console(stderr=True)

HoldOption = Annotated[float, typer.Option(
    envvar="DSEC_PLACEMENT_HOLD_S",
    help="Seconds a GPU that was degraded must stay healthy before it is offered again.")]
DataDirOption = Annotated[Path | None, typer.Option(help="Where the store and state live.")]
BootstrapOption = Annotated[str | None, typer.Option(help="Kafka (or DSEC_BOOTSTRAP).")]


def _settings(**overrides: object) -> DsecSettings:
    return DsecSettings(**{k: v for k, v in overrides.items() if v is not None})


def _query(settings: DsecSettings):
    from dsec.history import query

    return lambda sql: query(settings, sql)


def _wait_for_signal() -> None:
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    stopping.wait()


@placement_app.command()
def serve(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="DSEC_PLACEMENT_PORT")] = 8470,
    hold_s: HoldOption = 600.0,
    refresh_s: Annotated[float, typer.Option(help="How often the history is read again.")] = 5.0,
    with_personalities: Annotated[bool, typer.Option(
        "--personalities", help="Run the personality job in this process too.")] = False,
    with_labels: Annotated[bool, typer.Option(
        "--label-nodes", help="Keep Kubernetes node labels and taints in step too.")] = False,
    label_interval_s: Annotated[float, typer.Option()] = 30.0,
    bootstrap: BootstrapOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """The recommendation API and kube-scheduler extender (OpenAPI at /openapi.json), with
    /metrics and /healthz on DSEC_METRICS_PORT."""
    import uvicorn

    from dsec.infra.observability import ProcessMetrics
    from dsec.infra.observability.server import MetricsServer
    from dsec.placement.api import HistorySource, make_app, store_history
    from dsec.placement.ranking import PlacementConfig

    settings = _settings(data_dir=data_dir, bootstrap=bootstrap)
    metrics = ProcessMetrics()
    server = (MetricsServer(metrics, settings.metrics_host, settings.metrics_port).start()
              if settings.metrics_port else None)
    service = labeller = None
    if with_personalities:
        from dsec.services.personality import PersonalityService

        service = PersonalityService(settings, metrics)
        service.start()
    if with_labels:
        labeller = _start_labeller(settings, hold_s, label_interval_s)
    source = HistorySource(store_history(_query(settings)), refresh_s=refresh_s)
    try:
        uvicorn.run(make_app(source, PlacementConfig(hold_s=hold_s)), host=host, port=port,
                    log_level="warning")
    finally:
        if labeller is not None:
            labeller.set()
        if service is not None:
            service.stop()
        if server is not None:
            server.stop()


def _start_labeller(settings: DsecSettings, hold_s: float,
                    interval_s: float) -> threading.Event:
    """The node labeller on a thread of its own; set the event to stop it."""
    from dsec.placement.node_labels import NodeLabeller, kubernetes_core_api

    try:
        api = kubernetes_core_api()
    except ImportError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    labeller = NodeLabeller(api, _query(settings), hold_s=hold_s)
    stopping = threading.Event()

    def run() -> None:
        while not stopping.is_set():
            try:
                changed = labeller.sync()
                if changed:
                    console.print(f"nodes updated: {', '.join(changed)}")
            except Exception as exc:  # the API server or the store away: try next round
                err_console.print(f"[yellow]node labels not synced:[/yellow] {exc}")
            stopping.wait(interval_s)

    threading.Thread(target=run, name="dsec-node-labels", daemon=True).start()
    return stopping


@placement_app.command()
def recommend(
    workload: Annotated[str, typer.Option(help="A job, a pool or a declared workload class.")],
    count: Annotated[int, typer.Option(help="GPUs wanted together.")] = 1,
    pool: Annotated[str | None, typer.Option()] = None,
    regime: Annotated[str, typer.Option(help="short, medium, long or all.")] = "all",
    communicating: Annotated[bool, typer.Option(
        help="Keep the GPUs on one NUMA node and NVLink where possible.")] = False,
    url: Annotated[str | None, typer.Option(
        help="Ask a running `dsec placement serve` instead of reading the store here.")] = None,
    hold_s: HoldOption = 600.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Ranked GPUs with their scores and reasons, and the filtered ones with why."""
    from pydantic import ValidationError

    from dsec.schemas import now_ms
    from dsec.schemas.placement import Recommendation, RecommendRequest

    try:
        asked = RecommendRequest(workload=workload, count=count, pool=pool, regime=regime,
                                 communicating=communicating)
    except ValidationError as exc:
        err_console.print(f"[red]invalid request:[/red] {exc}")
        raise typer.Exit(2) from None
    if url:
        import urllib.error
        import urllib.request

        post = urllib.request.Request(
            f"{url.rstrip('/')}/v1/recommend", data=asked.model_dump_json().encode(),
            method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(post, timeout=30) as response:
                answer = Recommendation.model_validate_json(response.read())
        except urllib.error.HTTPError as exc:
            err_console.print(f"[red]{exc.code}:[/red] {exc.read().decode(errors='replace')}")
            raise typer.Exit(1) from None
        except OSError as exc:
            err_console.print(f"[red]{url} unreachable:[/red] {exc}")
            raise typer.Exit(1) from None
    else:
        from dsec.history import HistoryError
        from dsec.placement.history import read_history
        from dsec.placement.ranking import PlacementConfig
        from dsec.placement.ranking import recommend as rank

        try:
            history = read_history(_query(_settings(data_dir=data_dir)))
        except HistoryError as exc:
            err_console.print(f"[red]history unreadable:[/red] {exc}")
            raise typer.Exit(1) from None
        answer = rank(history, asked, now_ms(), PlacementConfig(hold_s=hold_s))
    if as_json:
        print(json.dumps(answer.model_dump(mode="json")))
        return
    table = Table(title=f"{answer.workload}: chosen {', '.join(answer.chosen) or 'none'}")
    for column in ("GPU", "model", "node", "score", "reasons"):
        table.add_column(column)
    for gpu in answer.ranked:
        table.add_row(gpu.gpu_uuid, gpu.gpu_model, gpu.node_id, f"{gpu.score:.3f}",
                      "\n".join(f"{r.source} {r.key}: {r.detail}" for r in gpu.reasons))
    for gpu in answer.filtered:
        table.add_row(gpu.gpu_uuid, gpu.gpu_model, gpu.node_id, "filtered", gpu.why)
    console.print(table)


@placement_app.command()
def personalities(bootstrap: BootstrapOption = None) -> None:
    """Run the personality job until Ctrl-C (or `dsec up --services ...,placement`)."""
    from dsec.infra.topics import ensure_topics
    from dsec.services.personality import PersonalityService

    settings = _settings(bootstrap=bootstrap)
    ensure_topics(settings)
    service = PersonalityService(settings)
    service.start()
    try:
        _wait_for_signal()
    finally:
        service.stop()


@placement_app.command()
def topology(
    node: Annotated[str | None, typer.Option(help="This node's id (or DSEC_NODE_ID).")] = None,
    bootstrap: BootstrapOption = None,
) -> None:
    """Read this node's GPU topology from NVML once and publish it."""
    from dsec.infra.kafka_clients import make_producer
    from dsec.ingest.gpu_topology import read_topology
    from dsec.schemas import encode, topic_names

    settings = _settings(bootstrap=bootstrap)
    node_id = node or settings.node_id or socket.gethostname()
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        err_console.print(f"[red]no NVML on this host:[/red] {exc}")
        raise typer.Exit(1) from None
    try:
        events = read_topology(pynvml, node_id)
    finally:
        pynvml.nvmlShutdown()
    producer = make_producer(settings, "dsec-placement-topology")
    topic = topic_names(settings.topic_prefix).gpu_topology
    for event in events:
        producer.produce(topic, key=event.gpu_uuid.encode(), value=encode(event))
    if producer.flush(30):
        err_console.print("[red]topology not delivered[/red]")
        raise typer.Exit(1)
    console.print(f"{len(events)} GPUs of {node_id} published to {topic}")


@placement_app.command("label-nodes")
def label_nodes(
    interval_s: Annotated[float, typer.Option()] = 30.0,
    hold_s: HoldOption = 600.0,
    data_dir: DataDirOption = None,
) -> None:
    """Keep Kubernetes node labels and taints in step with GPU health until Ctrl-C (needs
    the `kubernetes` client and a kubeconfig or in-cluster service account)."""
    stopping = _start_labeller(_settings(data_dir=data_dir), hold_s, interval_s)
    try:
        _wait_for_signal()
    finally:
        stopping.set()
