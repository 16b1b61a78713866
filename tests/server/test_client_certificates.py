"""--ssl-cert-reqs (vLLM's flag): with 2, a TLS client without a certificate signed by
--ssl-ca-certs is refused in the handshake, and one with such a certificate gets through. Real
certificates (made with the openssl command) and the uvicorn TLS context the server serves with."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from folio.entrypoints.openai.api_server import _uvicorn_config, make_parser
from folio.entrypoints.openai.cli_args import ServerConfig

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA,
    and a second client certificate signed by nobody the server trusts."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=folio-test-ca", cwd=d)
    for name, extra in (("server", ["-addext", "subjectAltName=IP:127.0.0.1"]), ("client", []), ("stranger", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", *extra, cwd=d)
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []), cwd=d)
    _openssl("x509", "-req", "-in", "stranger.csr", "-signkey", "stranger.key", "-out", "stranger.pem",
             "-days", "2", cwd=d)
    return d


def _server_context(pki: Path, cert_reqs: str) -> ssl.SSLContext:
    args = make_parser().parse_args([
        "--device", "cpu", "--ssl-keyfile", str(pki / "server.key"), "--ssl-certfile", str(pki / "server.pem"),
        "--ssl-ca-certs", str(pki / "ca.pem"), "--ssl-cert-reqs", cert_reqs])
    config = _uvicorn_config(None, ServerConfig.from_cli_args(args), 1.0)  # what FolioServer serves with
    config.load()
    return config.ssl


async def _handshake(server_ctx: ssl.SSLContext, pki: Path, client_cert: str | None) -> bytes:
    """One TLS connection to a server on server_ctx: what the server echoes (b"" if refused)."""
    async def echo(reader, writer):
        try:
            writer.write(await reader.readline())
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if client_cert is not None:
        client_ctx.load_cert_chain(str(pki / f"{client_cert}.pem"), str(pki / f"{client_cert}.key"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        writer.write(b"hello\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return line
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        server.close()
        await server.wait_closed()


def test_required_client_certificates_are_checked(pki):
    ctx = _server_context(pki, "2")
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert asyncio.run(_handshake(ctx, pki, "client")) == b"hello\n"
    assert asyncio.run(_handshake(ctx, pki, None)) == b""  # no certificate: refused
    assert asyncio.run(_handshake(ctx, pki, "stranger")) == b""  # not signed by the CA: refused


def test_without_cert_reqs_no_certificate_is_asked_for(pki):
    ctx = _server_context(pki, "0")
    assert ctx.verify_mode == ssl.CERT_NONE
    assert asyncio.run(_handshake(ctx, pki, None)) == b"hello\n"


@pytest.mark.parametrize("argv, message", [
    (["--ssl-cert-reqs", "3"], "--ssl-cert-reqs must be 0 .none., 1 .optional. or 2 .required., got 3"),
    (["--ssl-cert-reqs", "2"], "--ssl-cert-reqs 2 needs --ssl-ca-certs"),
])
def test_bad_cert_reqs_are_refused(pki, argv, message):
    tls = ["--ssl-keyfile", str(pki / "server.key"), "--ssl-certfile", str(pki / "server.pem")]
    with pytest.raises(ValueError, match=message):
        ServerConfig.from_cli_args(make_parser().parse_args(["--device", "cpu", *tls, *argv]))
