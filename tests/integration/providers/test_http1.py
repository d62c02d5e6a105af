"""The lean upstream client's pool (:mod:`gateway.providers.http1`) against real servers on
loopback: keep-alive reuse, ``max_connections`` and waiting callers, refused and hanging
connects, https, the name lookup cache."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from gateway.providers import http1
from gateway.providers.http1 import Http1Transport
from tests.integration.providers.http1_servers import Server, answer, deployment, keep_answering, post, run


def test_keeps_the_connection_alive_across_requests() -> None:
    async def main() -> None:
        server = Server(None)  # type: ignore[arg-type]
        server.handler = keep_answering(server)
        async with server:
            transport = Http1Transport(server.url, deployment())
            for _ in range(5):
                assert await post(transport) == (200, b'{"ok":true}')
            assert server.connections == 1
            await transport.close()

    run(main())


def test_refused_is_a_connector_error() -> None:
    async def main() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nothing listens there now
        transport = Http1Transport(f"http://127.0.0.1:{port}/v1", deployment())
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await transport.send("/x", {}, headers={}, connect_timeout_s=2)
        assert isinstance(caught.value.os_error, ConnectionRefusedError)
        assert transport._open == 0  # the slot is free again
        await transport.close()

    run(main())


def test_a_connect_that_hangs_times_out_as_a_timeout_error() -> None:
    async def main() -> None:
        # A listener whose backlog is full drops further SYNs: connects hang.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(address)
            fillers.append(filler)
        await asyncio.sleep(0.05)
        transport = Http1Transport(f"http://127.0.0.1:{address[1]}/v1", deployment())
        with pytest.raises(TimeoutError) as caught:
            await transport.send("/x", {}, headers={}, connect_timeout_s=0.2)
        assert isinstance(caught.value, aiohttp.ClientError)
        assert transport._open == 0
        await transport.close()
        for s in [*fillers, listener]:
            s.close()

    run(main())


def test_the_pool_holds_max_connections_and_callers_wait_in_turn() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        open_now = peak = 0

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal open_now, peak
            open_now += 1
            peak = max(peak, open_now)
            try:
                while True:
                    await server.read_request(reader)
                    await gate.wait()
                    writer.write(answer(b"{}"))
                    await writer.drain()
            finally:
                open_now -= 1

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment(", max_connections: 2"))
            calls = [asyncio.ensure_future(post(transport)) for _ in range(6)]
            # One waiter gives up: its turn must pass on, not leak.
            quitter = asyncio.ensure_future(post(transport))
            await asyncio.sleep(0.05)
            quitter.cancel()
            gate.set()
            assert await asyncio.gather(*calls) == [(200, b"{}")] * 6
            assert peak == 2 and server.connections == 2
            assert transport._open == 2 and not transport._waiters
            await transport.close()

    run(main())


def test_cancelled_while_waiting_for_headers_drops_the_connection() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                if server.connections == 1:
                    await reader.read()
                    return
                writer.write(answer(b"{}"))
                await writer.drain()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment(", max_connections: 1"))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            assert await post(transport) == (200, b"{}")
            assert server.connections == 2
            await transport.close()

    run(main())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_https_checks_the_certificate_against_the_host(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate

    async def main() -> None:
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        server = Server(None)  # type: ignore[arg-type]
        server.handler = keep_answering(server)
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=server_context)
        port = server.server.sockets[0].getsockname()[1]
        try:
            # Not trusted: the handshake fails before anything is sent.
            untrusted = Http1Transport(f"https://localhost:{port}/v1", deployment())
            with pytest.raises(aiohttp.ClientConnectorError):
                await untrusted.send("/x", {}, headers={}, connect_timeout_s=2)
            trusting = ssl.create_default_context(cafile=str(cert))
            monkeypatch.setattr(http1, "_ssl_context", lambda: trusting)
            transport = Http1Transport(f"https://localhost:{port}/v1", deployment())
            assert await post(transport) == (200, b'{"ok":true}')
            assert await post(transport) == (200, b'{"ok":true}')
            assert server.connections == 1  # one kept alive (the refused handshake never got that far)
            assert server.heads[0].split(b"\r\n")[1] == f"Host: localhost:{port}".encode()
            await transport.close()
        finally:
            server.server.close()

    run(main())


def test_a_waiter_cancelled_as_a_connection_comes_free_does_not_lose_it() -> None:
    async def main() -> None:
        server = Server(None)  # type: ignore[arg-type]
        server.handler = keep_answering(server)
        async with server:
            transport = Http1Transport(server.url, deployment(", max_connections: 1"))
            held = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            await held.read()
            waiting = asyncio.ensure_future(post(transport))
            await asyncio.sleep(0.01)
            waiting.cancel()  # its future is cancelled now, its task runs later
            held.release()  # frees the connection in the same step
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await post(transport) == (200, b'{"ok":true}')
            assert server.connections == 1 and transport._open == 1 and not transport._waiters
            await transport.close()

    run(main())


def test_a_host_name_is_looked_up_once_for_a_burst_of_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    lookups = 0
    look_up = Http1Transport._look_up

    async def counted(self: Http1Transport) -> list[str]:
        nonlocal lookups
        lookups += 1
        return await look_up(self)

    monkeypatch.setattr(Http1Transport, "_look_up", counted)

    async def main() -> None:
        gate = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                await gate.wait()
                writer.write(answer(b"{}"))
                await writer.drain()

        server = Server(handler)
        async with server:
            port = server.url.split(":")[2].split("/")[0]
            transport = Http1Transport(f"http://localhost:{port}/v1", deployment())
            calls = [asyncio.ensure_future(post(transport)) for _ in range(4)]
            await asyncio.sleep(0.05)
            gate.set()
            assert await asyncio.gather(*calls) == [(200, b"{}")] * 4
            assert server.connections == 4 and lookups == 1
            transport._addresses_until = 0.0  # the cached addresses expire
            more = [post(transport) for _ in range(5)]  # four idle connections and a new one
            assert await asyncio.gather(*more) == [(200, b"{}")] * 5
            assert server.connections == 5 and lookups == 2
            head = server.heads[-1].split(b"\r\n")[1]
            assert head == f"Host: localhost:{port}".encode()
            await transport.close()

    run(main())
