"""``dsec pool``: resource pools as signed data on the pools topic (validate, publish,
list, delete)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.cli.policy_rollout import rollouts
from dsec.schemas.settings import DsecSettings

pool_app = typer.Typer(no_args_is_help=True, help="Resource pools: quotas, labels and "
                                                  "per-pool policy parameters.")
console = Console()
err_console = Console(stderr=True)


def _load(path: Path, settings: DsecSettings | None = None):
    """The pool in ``path``; with ``settings``, checked against the policies the engine
    runs (each override names a parameter the policy has, within its bounds)."""
    from dsec.policy_engine.pool_registry import parse_pool
    from dsec.policy_engine.registry import PolicyRejected

    try:
        pool = parse_pool(path.read_bytes())
    except PolicyRejected as exc:
        err_console.print(f"[red]{path}: rejected:[/red] {exc.reason}")
        raise typer.Exit(2) from None
    except OSError as exc:
        err_console.print(f"[red]{path}: {exc.strerror}[/red]")
        raise typer.Exit(2) from None
    if settings is not None:
        _check_fits(path, pool, settings)
    return pool


def _check_fits(path: Path, pool, settings: DsecSettings) -> None:
    import secrets

    from dsec.policy_engine.pool_registry import PoolRegistry
    from dsec.schemas.signing import HmacSigner, HmacVerifier

    view = rollouts(settings)
    # a trial installation, nothing published: any key of the moment signs it
    signer = HmacSigner(secrets.token_bytes(32))
    trial = PoolRegistry(HmacVerifier(signer.key))
    trial.install(signer.sign(pool.model_copy(update={"signature": None})))
    problems = []
    for name in sorted({*pool.params, *(p for p, _ in _quota_policies(pool))}):
        spec = view.registry.get(name)
        if spec is None:
            problems.append(f"no policy {name} runs")
            continue
        problem = trial.effective(spec, pool.name).problem
        if problem:
            problems.append(problem)
    if problems:
        err_console.print(f"[red]{path}: rejected:[/red] {'; '.join(problems)}")
        raise typer.Exit(2)


def _quota_policies(pool) -> list[tuple[str, str]]:
    from dsec.schemas.pools import QUOTA_PARAMS

    return [QUOTA_PARAMS[q] for q, v in pool.quotas.model_dump().items() if v is not None]


@pool_app.command("validate")
def validate(files: list[Path]) -> None:
    """Check pool files (schema, bounds) without publishing anything."""
    for path in files:
        pool = _load(path)
        console.print(f"{path}: pool {pool.name} v{pool.version} ok")


@pool_app.command("publish")
def publish(
    file: Path,
    bump: Annotated[bool, typer.Option(help="Publish as the next version after the one on "
                                            "the topic.")] = False,
) -> None:
    """Validate FILE against the running policies, sign it and publish it, keyed by the
    pool's name; it replaces the pool's latest version, tuned values included."""
    from dsec.infra.keys import signer_for
    from dsec.policy_engine.policy_log import publish_pool
    from dsec.schemas.trust import KeyRole

    settings = DsecSettings()
    pool = _load(file, settings)
    signer = signer_for(settings, KeyRole.POOL_PUBLISHER)
    view = rollouts(settings)
    latest = view.pools.next_version(pool.name) - 1
    if latest:
        if bump:
            pool = pool.model_copy(update={"version": max(pool.version, latest + 1)})
        elif pool.version <= latest:
            err_console.print(f"[red]pool {pool.name} v{latest} is on the topic; publish a "
                              "higher version (or --bump)[/red]")
            raise typer.Exit(1)
    current = view.pools.get(pool.name)
    if current is not None and current.reason:
        console.print(f"replaces pool {pool.name} v{current.version} ({current.reason})")
    publish_pool(settings, signer.sign(pool.model_copy(update={"reason": pool.reason or
                                                               "dsec pool publish"})))
    console.print(f"published pool {pool.name} v{pool.version}")


@pool_app.command("list")
def list_pools(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
               ) -> None:
    """The pools on the topic: labels, quotas, overrides, dry run, and why the latest
    version was published."""
    view = rollouts(DsecSettings())
    rows = [{
        "name": p.name, "version": p.version, "labels": p.labels,
        "quotas": p.quotas.model_dump(exclude_none=True), "params": p.params,
        "dry_run": p.dry_run, "reason": p.reason,
    } for p in view.pools.all()]
    if as_json:
        print(json.dumps({"pools": rows, "rejected": {
            name: why for name, why in view.rejected.items() if name.startswith("pool:")}}))
        return
    table = Table()
    for column in ("name", "version", "labels", "quotas", "params", "dry_run", "reason"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(json.dumps(row[c]) if isinstance(row[c], dict) else str(row[c])
                        for c in ("name", "version", "labels", "quotas", "params", "dry_run",
                                  "reason")))
    console.print(table)


@pool_app.command("delete")
def delete(name: str) -> None:
    """Delete pool NAME: a signed deletion of every version up to the latest; its workers
    run the policies' own parameters again."""
    from dsec.infra.keys import signer_for
    from dsec.policy_engine.policy_log import publish_pool
    from dsec.schemas import PoolDeletion
    from dsec.schemas.trust import KeyRole

    settings = DsecSettings()
    signer = signer_for(settings, KeyRole.POOL_PUBLISHER)
    latest = rollouts(settings).pools.next_version(name) - 1
    if not latest:
        err_console.print(f"[red]no pool {name} on the topic[/red]")
        raise typer.Exit(1)
    publish_pool(settings, signer.sign(PoolDeletion(deletes=name, up_to_version=latest)))
    console.print(f"deleted pool {name} up to v{latest}")
