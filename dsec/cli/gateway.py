"""``dsec ingest-gateway``: HTTP ingest for runtimes that are not Python."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError


def ingest_gateway(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token runtimes present (or DSEC_GATEWAY_TOKEN).")
    ] = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers.")] = None,
    tls_certfile: Annotated[
        Path | None, typer.Option(help="TLS certificate (PEM); serves HTTPS with --tls-keyfile.")
    ] = None,
    tls_keyfile: Annotated[Path | None, typer.Option(help="TLS private key (PEM).")] = None,
) -> None:
    """Serve runtime registration and metric ingest over HTTP; policies go back by webhook."""
    from dsec.ingest.gateway_config import GatewayConfig
    from dsec.schemas.settings import DsecSettings
    from dsec.services.gateway import run_gateway

    given = {"host": host, "port": port, "token": token, "tls_certfile": tls_certfile,
             "tls_keyfile": tls_keyfile}
    try:
        config = GatewayConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in exc.errors())
        typer.echo(f"invalid gateway configuration ({fields}); the token comes from --token "
                   "or DSEC_GATEWAY_TOKEN", err=True)
        raise typer.Exit(2) from None
    settings = DsecSettings(**({"bootstrap": bootstrap} if bootstrap else {}))
    run_gateway(settings, config)
