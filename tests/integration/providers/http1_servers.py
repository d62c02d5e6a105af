"""Servers and helpers for the HTTP/1.1 client's tests: a scripted raw-socket server that
counts connections and keeps the request heads it read, and canned answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import uvloop

from gateway.config import parse_policy
from gateway.policy import Deployment
from gateway.providers.http1 import Http1Transport

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
