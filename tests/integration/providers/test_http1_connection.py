"""One connection of the lean upstream client (:mod:`gateway.providers.http1_connection`)
against real servers on loopback: the request it sends, chunked and EOF-ended answers
handed on read by read, cut bodies, ``Connection: close``, stalls, gzip, trailers, flow
control, and the exception classes dispatch's failure table reads."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.providers.http1 import Http1Transport
from gateway.providers.transport import HttpTransport, Transport
from tests.integration.providers.http1_servers import Server, answer, deployment, keep_answering, post, run


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


def test_a_policy_header_with_a_line_break_fails_each_request_not_the_load() -> None:
    async def main() -> None:
        transport = Http1Transport("http://127.0.0.1:9/v1", deployment(', headers: {X-Bad: "a\\nb"}'))
        with pytest.raises(ValueError, match="line break"):
            await transport.send("/x", {}, headers={}, connect_timeout_s=1)

    run(main())


def _sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_an_answer_whose_body_ends_late_is_released_when_the_end_comes() -> None:
    """[DONE] came but not the body's end: release_at_end drops what follows and returns
    the connection when the end arrives (no reader, no task), so the next request reuses it."""

    async def main() -> None:
        ended = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(_sse_head() + _chunk(b"data: [DONE]\n\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(_chunk(b": bytes after the answer\n\n") + b"0\r\n\r\n")
            await writer.drain()
            ended.set()
            while True:
                await server.read_request(reader)
                writer.write(answer(b'{"second":true}'))
                await writer.drain()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            assert await anext(resp.iter_chunks()) == b"data: [DONE]\n\n"
            assert not resp.complete()
            assert resp.release_at_end(0.5)
            await ended.wait()
            await asyncio.sleep(0.05)
            assert await post(transport) == (200, b'{"second":true}')
            assert server.connections == 1
            await transport.close()

    run(main())


def test_an_answer_whose_body_does_not_end_in_time_loses_its_connection() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            if server.connections == 1:
                writer.write(_sse_head() + _chunk(b"data: [DONE]\n\n"))
                await writer.drain()
                await reader.read()  # never ends the body; waits for the client to close
                return
            writer.write(answer(b"{}"))
            await writer.drain()
            await reader.read()

        server = Server(handler)
        async with server:
            transport = Http1Transport(server.url, deployment())
            resp = await transport.send("/x", {}, headers={}, connect_timeout_s=2)
            assert await anext(resp.iter_chunks()) == b"data: [DONE]\n\n"
            assert resp.release_at_end(0.2)
            await asyncio.sleep(0.3)
            assert await post(transport) == (200, b"{}")
            assert server.connections == 2
            await transport.close()

    run(main())
