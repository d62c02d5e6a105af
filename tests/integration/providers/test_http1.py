"""The lean upstream client (:mod:`gateway.providers.http1`) against real servers on loopback:
scripted raw-socket servers for the edge cases (cut bodies, ``Connection: close``, stalls,
gzip, refused and hanging connects) and aiohttp's server for a chunked stream."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import uvloop
from aiohttp import web

from gateway.config import parse_policy
from gateway.policy import Deployment
from gateway.providers import http1
from gateway.providers.http1 import Http1Transport
from gateway.providers.transport import HttpTransport, Transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop, the gateway's loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


def deployment(extra: str = "") -> Deployment:
    policy = parse_policy(
        f'deployments:\n  d: {{provider: openai, base_url: "http://x/v1", model: m{extra}}}\n'
        "tiers: {fast: [d], strong: [d]}\n",
        "t.yaml",
    )
    return policy.deployments["d"]


class Server:
    """A raw TCP server: ``handler(reader, writer)`` per connection; counts connections and
    keeps every request head it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One request's head and body (by Content-Length)."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return await reader.readexactly(length)


def answer(body: bytes, *headers: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def keep_answering(server: Server, body: bytes = b'{"ok":true}', *headers: str) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(answer(body, *headers))
            await writer.drain()

    return handler


async def post(transport: Http1Transport, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    resp = await transport.send("/chat/completions", {"x": 1}, headers=headers or {}, connect_timeout_s=2)
    data = await resp.read()
    resp.release()
    return resp.status, data


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


def test_sends_the_same_headers_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_KEY", "sk-test")

    async def main() -> None:
        server = Server(None)  # type: ignore[arg-type]
        server.handler = keep_answering(server)
        async with server:
            d = deployment(", api_key_env: UP_KEY, headers: {X-Team: blue}")
            transport = Http1Transport(server.url, d)
            await post(transport, {"x-request-id": "r1", "X-TEAM": "red"})
            head = server.heads[0].decode()
            lines = head.split("\r\n")
            assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
            named = {
                line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:] if line
            }
            port = server.url.split(":")[2].split("/")[0]
            assert named["host"] == f"127.0.0.1:{port}"
            assert named["content-type"] == "application/json"
            assert named["authorization"] == "Bearer sk-test"
            assert named["x-request-id"] == "r1"
            assert named["x-team"] == "red"  # the per-call header wins, whatever its case
            assert named["content-length"] == str(len(orjson.dumps({"x": 1})))
            assert "accept-encoding" not in named  # answers come identity-encoded
            assert sum(1 for line in lines if line.lower().startswith("x-team")) == 1
            await transport.close()

    run(main())


def test_a_header_with_a_line_break_is_refused() -> None:
    async def main() -> None:
        transport = Http1Transport("http://127.0.0.1:9/v1", deployment())
        with pytest.raises(ValueError, match="line break"):
            await transport.send("/x", {}, headers={"x-request-id": "a\r\nEvil: 1"}, connect_timeout_s=1)

    run(main())


def test_chunked_stream_yields_each_read_as_it_arrives() -> None:
    async def main() -> None:
        next_event = asyncio.Event()

        async def sse(request: web.Request) -> web.StreamResponse:
            await request.read()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"data: {i}\n\n".encode())
                await next_event.wait()  # the client must have the event before the next is sent
                next_event.clear()
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", sse)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = Http1Transport(f"http://127.0.0.1:{port}/v1", deployment())
        got = []
        for _ in range(2):
            resp = await transport.send("/chat/completions", {}, headers={}, connect_timeout_s=2)
            assert resp.headers["content-type"] == "text/event-stream"
            async for chunk in resp.iter_chunks():
                got.append(chunk)
                next_event.set()
            assert resp.complete()
            resp.release()
        assert got == [f"data: {i}\n\n".encode() for i in range(3)] * 2
        await transport.close()
        await runner.cleanup()

    run(main())


def test_a_body_cut_short_fails_and_the_connection_is_not_reused() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            if server.connections == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"partial":')
                await writer.drain()
                return  # closes mid-body
            writer.write(answer(b"{}"))
            await writer.drain()
            await reader.read()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            chunks = resp.iter_chunks()
            assert await anext(chunks) == b'{"partial":'
            with pytest.raises(aiohttp.ClientPayloadError):
                await anext(chunks)
            assert not resp.complete()
            resp.release()  # not complete: dropped, never pooled
            assert await post(transport) == (200, b"{}")
            assert server.connections == 2
            await transport.close()

    run(main())


def test_connection_close_is_honoured() -> None:
    async def main() -> None:
        server = Server(None)  # type: ignore[arg-type]
        server.handler = keep_answering(server, b"{}", "Connection: close")
        async with server:
            transport = Http1Transport(server.url, deployment())
            for _ in range(3):
                assert await post(transport) == (200, b"{}")
            assert server.connections == 3
            await transport.close()

    run(main())


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(answer(b"{}"))
            await writer.drain()  # then closes the kept-alive connection

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            assert await post(transport) == (200, b"{}")
            await asyncio.sleep(0.05)  # the close arrives while the connection is idle
            assert await post(transport) == (200, b"{}")
            assert server.connections == 2
            await transport.close()

    run(main())


def test_closed_before_the_headers_is_a_disconnect() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            await transport.close()

    run(main())


def test_garbage_instead_of_http_fails_without_a_connector_error() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()
            await reader.read()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            with pytest.raises(aiohttp.ClientError) as caught:
                await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            assert not isinstance(caught.value, aiohttp.ClientConnectorError)
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


def test_a_stalled_body_can_be_abandoned_and_its_connection_is_dropped() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                if server.connections == 1:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
                    await writer.drain()
                    await reader.read()  # stalls until the client goes
                    return
                writer.write(answer(b"{}"))
                await writer.drain()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            chunks = resp.iter_chunks()
            assert await anext(chunks) == b"12345"
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await anext(chunks)
            resp.close()
            assert await post(transport) == (200, b"{}")
            assert server.connections == 2
            await transport.close()

    run(main())


def test_gzip_is_decompressed_and_other_encodings_fail_clearly() -> None:
    async def main() -> None:
        body = orjson.dumps({"choices": [{"text": "x" * 5000}]})

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                if len(server.heads) == 1:
                    writer.write(answer(gzip.compress(body), "Content-Encoding: gzip"))
                else:
                    writer.write(answer(b"\x00\x01", "Content-Encoding: br"))
                await writer.drain()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            assert await post(transport) == (200, body)
            with pytest.raises(aiohttp.ClientPayloadError, match="Content-Encoding: br"):
                await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            await transport.close()

    run(main())


def test_a_body_that_ends_at_eof_is_read_to_the_end() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + b'{"a":')
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"1}")

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            assert await post(transport) == (200, b'{"a":1}')
            assert await post(transport) == (200, b'{"a":1}')
            assert server.connections == 2
            await transport.close()

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


@pytest.mark.parametrize("make", [Http1Transport, HttpTransport], ids=["http1", "aiohttp"])
def test_both_clients_raise_what_the_failure_table_reads(make: type[Transport]) -> None:
    """The same failure reaches dispatch as the same class whichever client is chosen
    (``SWITCHYARD_UPSTREAM_CLIENT``)."""

    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            body = await server.read_request(reader)
            if body == b'{"case":"no-head"}':
                return
            if body == b'{"case":"cut"}':
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
            else:
                writer.write(answer(gzip.compress(b'{"ok":1}'), "Content-Encoding: gzip"))
            await writer.drain()

        server = Server(handler)
        async with server:
            url = server.url
            transport = make(url, deployment())  # type: ignore[call-arg]

            async def call(case: str) -> bytes:
                resp = await transport.send("/x", {"case": case}, headers={}, connect_timeout_s=2)
                try:
                    return await resp.read()
                finally:
                    resp.close()

            with pytest.raises(aiohttp.ServerDisconnectedError):
                await call("no-head")
            with pytest.raises(aiohttp.ClientPayloadError):
                await call("cut")
            assert await call("gzip") == b'{"ok":1}'
            await transport.close()
        refused = make(url, deployment())  # type: ignore[call-arg]
        with pytest.raises(aiohttp.ClientConnectorError):
            await call_once(refused)
        await refused.close()

    run(main())


async def call_once(transport: Transport) -> None:
    resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
    resp.close()


def test_trailers_do_not_leak_into_the_next_answer() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
                b"2\r\n{}\r\n0\r\nX-Checksum: abc\r\n\r\n"
            )
            await server.read_request(reader)
            writer.write(answer(b"{}"))
            await writer.drain()
            await reader.read()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            assert await post(transport) == (200, b"{}")
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            assert "X-Checksum" not in resp.headers and resp.headers["Content-Length"] == "2"
            resp.close()
            assert server.connections == 1
            await transport.close()

    run(main())


def test_a_large_body_read_slowly_pauses_the_socket_and_arrives_whole() -> None:
    async def main() -> None:
        body = bytes(range(256)) * (12 * 1024)  # 3 MiB

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                writer.write(answer(body))
                await writer.drain()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            parts = []
            await asyncio.sleep(0.1)  # the socket fills the buffer past its high-water mark
            async for chunk in resp.iter_chunks():
                parts.append(chunk)
                await asyncio.sleep(0.001)
            assert b"".join(parts) == body
            resp.release()
            assert await post(transport) == (200, body)  # the resumed connection is reused
            assert server.connections == 1
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
