"""The gateway's HTTP server on a real socket: connections that send no headers are closed,
and TLS serves with the configured certificate."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess

import httpx
import pytest
from gateway_server import serving

from dsec.infra.kafka_local import free_port
from dsec.ingest.gateway_config import GatewayConfig


def _closed_by_server(connection: socket.socket) -> bool:
    try:
        while True:
            if connection.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_that_send_no_headers_are_closed() -> None:
    port = free_port()
    config = GatewayConfig(token="t", port=port, header_timeout_s=0.5)
    with serving(config):
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"POST /v1/runtimes HTTP/1.1\r\nHo")
        try:
            # the server still answers others while they wait
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            for connection in [*silent, trickle]:
                connection.settimeout(20)
            assert all(_closed_by_server(connection) for connection in [trickle, *silent])
        finally:
            for connection in [*silent, trickle]:
                connection.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a cert")
def test_tls_serves_with_the_configured_certificate(tmp_path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = free_port()
    config = GatewayConfig(token="t", port=port, tls_certfile=cert, tls_keyfile=key)
    with serving(config):
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.get(f"https://127.0.0.1:{port}/healthz",
                         verify=trusted).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_tls_needs_both_the_certificate_and_the_key(tmp_path) -> None:
    with pytest.raises(ValueError, match="both"):
        GatewayConfig(token="t", tls_certfile=tmp_path / "cert.pem")
