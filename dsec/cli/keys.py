"""``dsec keys``: signing keys and the trust list (generate, list, trust, revoke)."""

from __future__ import annotations

import base64
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dsec.schemas.settings import DsecSettings

keys_app = typer.Typer(no_args_is_help=True,
                       help="Ed25519 signing keys and the trust list verifiers hold.")
console = Console()
err_console = Console(stderr=True)
DAY_MS = 86_400_000


class Role(StrEnum):
    command_signer = "command-signer"
    policy_publisher = "policy-publisher"
    pool_publisher = "pool-publisher"


def _pools(text: str) -> list[str]:
    return [pool.strip() for pool in text.split(",") if pool.strip()]


def _trust(settings: DsecSettings, public_key: str, role: Role, days: float,
           pools: list[str], note: str) -> str:
    """Adds ``public_key`` to the trust list file; returns its key id."""
    from dsec.infra.keys import KeyFileError, read_trust_list, write_trust_list
    from dsec.schemas import now_ms
    from dsec.schemas.trust import KeyRole, TrustedKey, TrustList, key_id_of, public_key_bytes

    path = settings.trust_list_path()
    try:
        trust = read_trust_list(path) if path.exists() else TrustList()
        entry = TrustedKey(
            key_id=key_id_of(public_key_bytes(public_key)), role=KeyRole(role.value),
            public_key=public_key, expires_at_ms=now_ms() + int(days * DAY_MS),
            pools=pools, note=note)
    except (KeyFileError, ValueError) as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    write_trust_list(path, trust.with_key(entry))
    return entry.key_id


def _public_key_text(given: str) -> str:
    """The base64 raw public key, from itself or from a PEM file (public or private)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
        load_pem_public_key,
    )

    path = Path(given)
    if not path.is_file():
        return given
    body = path.read_bytes()
    key = (load_pem_private_key(body, password=None) if b"PRIVATE KEY" in body
           else load_pem_public_key(body))
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        err_console.print(f"[red]{given}: not an Ed25519 key[/red]")
        raise typer.Exit(2)
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


@keys_app.command("generate")
def generate(
    role: Annotated[Role | None, typer.Argument(
        help="The role of the one key to make; none: a key per role and a trust list.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Where the private key goes (default: <keys dir>/<role>.pem).")] = None,
    replace: Annotated[bool, typer.Option(
        help="Replace the key file there (a rotation: keep the old key trusted until "
             "every verifier has the new one, then revoke it).")] = False,
    trust: Annotated[bool, typer.Option(help="Add the new key to the trust list.")] = True,
    days: Annotated[float, typer.Option(help="Days the trust entry is valid.")] = 365,
    pools: Annotated[str, typer.Option(help="A pool-publisher's pools, comma-separated.")] = "",
) -> None:
    """Make an Ed25519 signing key (owner-only PEM) and trust it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dsec.infra.keys import key_path, make_keyring, write_private_key
    from dsec.schemas.signing import Ed25519Signer
    from dsec.schemas.trust import KeyRole

    settings = DsecSettings()
    keys_dir = settings.keys_directory()
    if role is None:
        if not make_keyring(keys_dir, validity_days=int(days)):
            err_console.print(f"[red]{keys_dir} exists; give a role to add one key[/red]")
            raise typer.Exit(1)
        console.print(f"a key per role and their trust list in {keys_dir}")
        return
    path = out or key_path(keys_dir, KeyRole(role.value))
    key = Ed25519PrivateKey.generate()
    try:
        write_private_key(path, key, replace=replace)
    except FileExistsError:
        err_console.print(f"[red]{path} exists (--replace to rotate it)[/red]")
        raise typer.Exit(1) from None
    signer = Ed25519Signer(key)
    if trust:
        _trust(settings, signer.public_key, role, days, _pools(pools), note=str(path))
    console.print(f"{role.value} key {signer.key_id} in {path}; public key {signer.public_key}")


@keys_app.command("trust")
def trust_key(
    public_key: Annotated[str, typer.Argument(
        help="The base64 raw public key, or a PEM file holding the key.")],
    role: Annotated[Role, typer.Option(help="What the key may sign.")],
    days: Annotated[float, typer.Option(help="Days the entry is valid.")] = 365,
    pools: Annotated[str, typer.Option(help="A pool-publisher's pools, comma-separated.")] = "",
    note: Annotated[str, typer.Option(help="Who holds the key.")] = "",
) -> None:
    """Add a public key to the trust list, with its role and expiry."""
    settings = DsecSettings()
    key_id = _trust(settings, _public_key_text(public_key), role, days, _pools(pools), note)
    console.print(f"trusted {key_id} as {role.value} in {settings.trust_list_path()}")


@keys_app.command("revoke")
def revoke(key_id: str) -> None:
    """Revoke KEY_ID in the trust list: refused from now on by every verifier reading it."""
    from dsec.infra.keys import KeyFileError, read_trust_list, write_trust_list
    from dsec.schemas import now_ms

    settings = DsecSettings()
    path = settings.trust_list_path()
    try:
        trust = read_trust_list(path)
    except KeyFileError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    entry = trust.get(key_id)
    if entry is None:
        err_console.print(f"[red]no key {key_id} in {path}[/red]")
        raise typer.Exit(1)
    if entry.revoked_at_ms is None:
        write_trust_list(path, trust.with_key(entry.model_copy(
            update={"revoked_at_ms": now_ms()})))
    console.print(f"revoked {key_id} in {path}")


@keys_app.command("list")
def list_keys(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The trust list: each key's id, role, pools, expiry and whether it signs now."""
    from dsec.infra.keys import KeyFileError, read_trust_list
    from dsec.schemas import now_ms

    settings = DsecSettings()
    try:
        trust = read_trust_list(settings.trust_list_path())
    except KeyFileError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    now = now_ms()
    rows = [{"key_id": k.key_id, "role": k.role.value, "pools": k.pools,
             "expires_at_ms": k.expires_at_ms, "revoked_at_ms": k.revoked_at_ms,
             "state": k.refusal(now) or "valid", "note": k.note} for k in trust.keys]
    if as_json:
        print(json.dumps({"trust_list": str(settings.trust_list_path()), "keys": rows}))
        return
    table = Table()
    for column in ("key_id", "role", "pools", "state", "note"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["key_id"], row["role"], ",".join(row["pools"]), row["state"],
                      row["note"])
    console.print(table)
