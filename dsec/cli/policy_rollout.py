"""``dsec policy status|history|promote|rollback|revert``: which version runs where, every
change, and changes made or undone as new signed records."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.schemas.settings import DsecSettings

if TYPE_CHECKING:
    from dsec.policy_engine.rollout import Rollouts

console = Console()
err_console = Console(stderr=True)
PoolOption = Annotated[str | None, typer.Option("--pool", help="The pool (of a canary, or "
                                                               "whose overrides to revert).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def rollouts(settings: DsecSettings) -> Rollouts:
    """The built-in pack and both topics, read as the engine reads them."""
    from dsec.infra.keys import verifier_for
    from dsec.policy_engine.builtin import load_builtin_policies
    from dsec.policy_engine.limits import PolicyLimits
    from dsec.policy_engine.policy_log import read_policy_log, read_pool_log
    from dsec.policy_engine.rollout import Rollouts

    return Rollouts(verifier_for(settings), load_builtin_policies(
                        settings.policy_params, dry_run=settings.policy_dry_run),
                    read_policy_log(settings)[0], read_pool_log(settings)[0],
                    PolicyLimits.from_settings(settings))


def _publish(settings: DsecSettings, records: list, said: str) -> None:
    from dsec.infra.keys import signer_for
    from dsec.policy_engine.policy_log import publish_policy_records, publish_pool
    from dsec.schemas import PoolSpec
    from dsec.schemas.trust import KeyRole

    # policies with the policy-publisher key, pools with the pool-publisher key
    signer = signer_for(settings, KeyRole.POLICY_PUBLISHER, also=[KeyRole.POOL_PUBLISHER])
    signed = [signer.sign(record) for record in records]
    pools = [r for r in signed if isinstance(r, PoolSpec)]
    for pool in pools:
        publish_pool(settings, pool)
    policies = [r for r in signed if not isinstance(r, PoolSpec)]
    if policies:
        publish_policy_records(settings, policies)
    console.print(said)


def _view(settings: DsecSettings) -> Rollouts:
    from dsec.policy_engine.policy_log import PolicyLogError

    try:
        return rollouts(settings)
    except PolicyLogError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]{exc}[/red]")
    return typer.Exit(1)


def status(name: str, as_json: JsonOption = False) -> None:
    """Which version of policy NAME runs where: the fleet's, the canaries, the pools that
    override its parameters or run it in dry run."""
    from dsec.policy_engine.rollout import RolloutError

    try:
        rows = _view(DsecSettings()).status(name)
    except RolloutError as exc:
        raise _fail(exc) from None
    if as_json:
        print(json.dumps({"policy": name, "running": [asdict(r) for r in rows]}))
        return
    table = Table(title=name)
    for column in ("where", "version", "dry_run", "how", "overrides"):
        table.add_column(column)
    for row in rows:
        overrides = ", ".join(f"{k}={v:g}" for k, v in row.overrides.items()) \
            if row.where != "fleet" else ""
        table.add_row(row.where, f"v{row.version}", str(row.dry_run), row.how, overrides)
    console.print(table)


def history(name: str, as_json: JsonOption = False) -> None:
    """Every version of policy NAME and every pool change of its parameters, oldest first
    (what `dsec policy revert` can go back to)."""
    from dsec.policy_engine.rollout import RolloutError

    try:
        entries = _view(DsecSettings()).history(name)
    except RolloutError as exc:
        raise _fail(exc) from None
    if as_json:
        print(json.dumps({"policy": name, "history": [asdict(e) for e in entries]}))
        return
    table = Table(title=name)
    for column in ("scope", "version", "parameters", "note"):
        table.add_column(column)
    for entry in entries:
        params = ", ".join(f"{k}={v:g}" for k, v in entry.params.items())
        table.add_row(entry.scope, f"v{entry.version}", params, entry.note)
    console.print(table)


def promote(name: str, pool: PoolOption = None) -> None:
    """Make the canary of policy NAME the fleet's version (the same version, out of dry
    run), then remove the canary; both are signed records the engine audits."""
    from dsec.policy_engine.rollout import RolloutError

    settings = DsecSettings()
    try:
        fleet, removal = _view(settings).promote(name, pool)
    except RolloutError as exc:
        raise _fail(exc) from None
    _publish(settings, [fleet, removal],
             f"promoted {name} v{fleet.version} from pool {removal.pool} to the fleet")


def rollback(name: str, pool: PoolOption = None) -> None:
    """Remove the canary of policy NAME (in POOL, or every one): its pool runs the
    fleet's version again."""
    from dsec.policy_engine.rollout import RolloutError

    settings = DsecSettings()
    try:
        removals = _view(settings).rollback(name, pool)
    except RolloutError as exc:
        raise _fail(exc) from None
    _publish(settings, list(removals), "rolled back " + ", ".join(
        f"{name} v{r.up_to_version} in pool {r.pool}" for r in removals))


def revert(
    name: str,
    to: Annotated[int | None, typer.Option(help="The version to go back to (a pool's own "
                                                "version with --pool).")] = None,
    pool: PoolOption = None,
) -> None:
    """Undo a change of policy NAME: publish version TO again as its next version (default:
    the fleet's version before the running one), or with --pool, set POOL's overrides of
    NAME back to its version TO (default: before their latest change)."""
    from dsec.policy_engine.rollout import RolloutError

    settings = DsecSettings()
    view = _view(settings)
    try:
        if pool is None:
            spec = view.revert(name, to)
            said = f"published {name} v{spec.version} (the body of v{to or 'before'})"
        else:
            spec = view.revert_pool(name, pool, to)
            said = f"published pool {pool} v{spec.version}: {spec.reason}"
    except RolloutError as exc:
        raise _fail(exc) from None
    _publish(settings, [spec], said)


def add_rollout_commands(app: typer.Typer) -> None:
    for command in (status, history, promote, rollback, revert):
        app.command(command.__name__)(command)
