"""``dsec policy``: write, check, publish, list, delete and replay policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.cli.policy_rollout import add_rollout_commands
from dsec.schemas.settings import DsecSettings

policy_app = typer.Typer(no_args_is_help=True, help="Policies as events: publish, list, test.")
console = Console()
err_console = Console(stderr=True)


def _load(path: Path, settings: DsecSettings | None = None):
    """The policy in ``path``, checked as the engine will check it at load (schema, CEL
    bounds, feature catalogue, function set); exits 2 with the reason when it would not run."""
    from dsec.policy_engine.limits import PolicyLimits
    from dsec.policy_engine.registry import PolicyRejected, compile_policy, parse_policy

    limits = PolicyLimits.from_settings(settings or DsecSettings())
    try:
        spec = parse_policy(path.read_bytes())
        compile_policy(spec, limits.condition)
    except PolicyRejected as exc:
        err_console.print(f"[red]{path}: rejected:[/red] {exc.reason}")
        raise typer.Exit(2) from None
    except OSError as exc:
        err_console.print(f"[red]{path}: {exc.strerror}[/red]")
        raise typer.Exit(2) from None
    return spec


@policy_app.command("validate")
def validate(files: list[Path]) -> None:
    """Check policy files (schema, bounds, CEL) without publishing anything."""
    for path in files:
        spec = _load(path)
        console.print(f"{path}: {spec.name} v{spec.version} ok")


@policy_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of a policy file (point an editor's YAML/JSON support at it)."""
    from dsec.schemas import PolicySpec

    print(json.dumps(PolicySpec.model_json_schema(), indent=2, sort_keys=True))


@policy_app.command("publish")
def publish(
    file: Path,
    bump: Annotated[bool, typer.Option(help="Publish as the next version after the "
                                             "one on the topic.")] = False,
    canary_pool: Annotated[str | None, typer.Option(
        help="Run this version in this pool alone (a canary): `dsec policy promote` "
             "makes it the fleet's, `dsec policy rollback` removes it.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Audit its decisions, command nothing (with --canary-pool: "
                          "beside the version that acts in the pool).")] = False,
) -> None:
    """Validate FILE, sign it with the policy-publisher key and publish it, keyed by its
    name (by name@POOL for a canary)."""
    from dsec.infra.keys import signer_for, verifier_for
    from dsec.policy_engine.policy_log import publish_policy, read_policy_log, topic_version
    from dsec.schemas.trust import KeyRole

    settings = DsecSettings()
    spec = _load(file, settings)
    if canary_pool is not None or dry_run:
        spec = _load_as(spec, canary_pool, dry_run)
    signer = signer_for(settings, KeyRole.POLICY_PUBLISHER)
    running = topic_version(read_policy_log(settings)[0], spec.name, verifier_for(settings))
    if canary_pool is not None:
        from dsec.cli.policy_rollout import rollouts

        running = rollouts(settings).registry.latest_version(spec.name) or None
    if running is not None:
        if bump:
            spec = spec.model_copy(update={"version": max(spec.version, running + 1)})
        elif spec.version <= running:
            err_console.print(f"[red]{spec.name} v{running} is on the topic; publish a higher "
                              "version (or --bump)[/red]")
            raise typer.Exit(1)
    publish_policy(settings, signer.sign(spec))
    where = f" as a canary in pool {canary_pool}" if canary_pool else ""
    console.print(f"published {spec.name} v{spec.version}{where}"
                  f"{' in dry run' if spec.dry_run else ''}")


def _load_as(spec, pool: str | None, dry_run: bool):
    """``spec`` as a canary of ``pool`` and/or in dry run, checked again as a whole."""
    from pydantic import ValidationError

    from dsec.schemas import PolicySpec
    from dsec.schemas.codec import describe

    body = spec.model_dump(mode="json", exclude_none=True)
    try:
        return PolicySpec.model_validate({**body, "pool": pool or body.get("pool"),
                                          "dry_run": dry_run or spec.dry_run})
    except ValidationError as exc:
        err_console.print(f"[red]rejected: {describe(exc)}[/red]")
        raise typer.Exit(2) from None


@policy_app.command("delete")
def delete(name: str) -> None:
    """Delete policy NAME (built-in or published): a signed deletion of every version up
    to the latest, keyed by NAME on the compacted policies topic."""
    from dsec.infra.keys import signer_for, verifier_for
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.policy_log import delete_policy, read_policy_log, topic_version
    from dsec.schemas import PolicyDeletion
    from dsec.schemas.trust import KeyRole

    settings = DsecSettings()
    signer = signer_for(settings, KeyRole.POLICY_PUBLISHER)
    versions = [p.version for p in load_builtin_policies() if p.name == name]
    published = topic_version(read_policy_log(settings)[0], name, verifier_for(settings))
    if published is not None:
        versions.append(published)
    if not versions:
        err_console.print(f"[red]no policy {name} on the topic or in the built-in pack[/red]")
        raise typer.Exit(1)
    delete_policy(settings, signer.sign(PolicyDeletion(deletes=name,
                                                       up_to_version=max(versions))))
    console.print(f"deleted {name} up to v{max(versions)}")


@policy_app.command("list")
def list_policies(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The policies the engine would run: the built-in pack and the policies topic."""
    from dsec.infra.keys import verifier_for
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.limits import PolicyLimits
    from dsec.policy_engine.policy_log import read_policy_log
    from dsec.policy_engine.registry import PolicyRegistry

    settings = DsecSettings()
    registry = PolicyRegistry(verifier_for(settings), PolicyLimits.from_settings(settings))
    builtin = {(p.name, p.version) for p in load_builtin_policies()}
    for policy in load_builtin_policies(settings.policy_params,
                                        dry_run=settings.policy_dry_run):
        registry.install_trusted(policy)
    rejected = {}
    for record in read_policy_log(settings)[0]:
        decision = registry.offer(record.key, record.value)
        if decision is not None and decision.decision == "policy_rejected":
            rejected[decision.policy_name] = decision.detail
    rows = [{
        "name": c.spec.name, "version": c.spec.version,
        "versions": registry.versions(c.spec.name),
        "source": "built-in" if (c.spec.name, c.spec.version) in builtin else "topic",
        "priority": c.spec.priority, "dry_run": c.spec.dry_run,
        "vectorised": c.enter.vectorised, "description": c.spec.description,
    } for c in registry.active()]
    if as_json:
        print(json.dumps({"policies": rows, "rejected": rejected}))
        return
    table = Table()
    for column in ("name", "version", "source", "priority", "dry_run", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row[c]) for c in ("name", "version", "source", "priority",
                                              "dry_run", "description")))
    console.print(table)
    for name, reason in rejected.items():
        console.print(f"[red]rejected[/red] {name}: {reason}")


@policy_app.command("test")
def test(
    file: Path,
    trace: Annotated[Path | None, typer.Option(
        help="Feature events, one JSON object a line.")] = None,
    against_history: Annotated[bool, typer.Option(
        "--against-history", help="Replay the stored features (ClickHouse) instead.")] = False,
    since: Annotated[str, typer.Option(
        help="With --against-history: from when (2h, 30m, 1d, or an ISO date and time).")
    ] = "1h",
    job: Annotated[str | None, typer.Option(
        help="With --against-history: one job's features only.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a decision.")] = False,
) -> None:
    """Evaluate FILE offline against a recorded TRACE, or the stored history, and print
    what it would have done."""
    from dsec.policy_engine.trace import read_trace, replay
    from dsec.schemas import DecodeError, now_ms

    if (trace is None) == (not against_history):
        err_console.print("[red]give --trace or --against-history (one of them)[/red]")
        raise typer.Exit(2)
    settings = DsecSettings()
    spec = _load(file, settings)
    try:
        if trace is not None:
            events = list(read_trace(trace))
        else:
            from dsec.history import HistoryError
            from dsec.history_features import parse_since, stored_feature_events

            try:
                events = list(stored_feature_events(
                    settings, parse_since(since, now_ms()), job_id=job))
            except (HistoryError, ValueError) as exc:
                err_console.print(f"[red]{exc}[/red]")
                raise typer.Exit(2) from None
        result = replay([spec], events)
    except DecodeError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    commands = {c.actuation_id: c for c in result.output.commands}
    for decision in result.output.decisions:
        command = commands.get(decision.actuation_id or "")
        row = {
            "event_time_ms": decision.event_time_ms,
            "worker_id": decision.identity.worker_id if decision.identity else None,
            "decision": str(decision.decision), "stage": decision.stage,
            "action": command.action.model_dump(mode="json") if command else None,
            "detail": decision.detail,
        }
        if as_json:
            print(json.dumps(row))
        else:
            print(f"{row['event_time_ms']} {row['worker_id']} {row['decision']} "
                  f"stage={row['stage']} {json.dumps(row['action'])} {row['detail']}")
    workers = {c.target.worker_id for c in result.output.commands}
    summary = (f"{result.events} events, {len(result.output.decisions)} decisions, "
               f"{len(result.output.commands)} commands on {len(workers)} workers")
    err_console.print(summary) if as_json else console.print(summary)


@policy_app.command("serve")
def serve(
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers.")] = None,
) -> None:
    """Run the policy engine alone (no stream jobs, no store) until Ctrl-C."""
    import logging

    from dsec.policy_engine.service import run_policy_engine

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = DsecSettings(**({"bootstrap": bootstrap} if bootstrap else {}))
    run_policy_engine(settings)


add_rollout_commands(policy_app)
