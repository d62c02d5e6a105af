"""The floor of a Python hop (bench/overhead.sh --floor): the least a proxy does for each
request, so the table shows how much of the gateway's CPU is its own work.

    python bench/floor.py --policy POLICY.yaml --port N [--server aiohttp|protocol]

Each request is read, its JSON parsed, sent on with the gateway's own upstream client
(:mod:`gateway.providers.http1`, to the deployment its ``model`` names in the policy) and
its answer returned whole (non-stream) or forwarded chunk by chunk as it arrives (stream).
Nothing else: no checks, routing, shaping, logging, metrics or stats. It runs on uvloop
with the gateway's garbage-collector settings (:func:`gateway.http.serve.tune_gc`).

``--server aiohttp`` (the default) answers with aiohttp's web server, one route and no
middleware: the stack the gateway is built on. ``--server protocol`` answers from a bare
``asyncio.Protocol`` with httptools' request parser: what any Python server costs at the
least, so the difference is aiohttp's server. It speaks only what wrk sends (keep-alive
HTTP/1.1 POSTs with a Content-Length, one at a time on a connection). Both answer
``GET /healthz`` with 200.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import httptools
import orjson
import uvloop
from aiohttp import web

from gateway.config import load_policy
from gateway.http.serve import tune_gc
from gateway.providers.http1 import Http1Transport
from gateway.providers.transport import TransportResponse

Upstreams = dict[str, Http1Transport]


async def send(upstreams: Upstreams, raw: bytes) -> tuple[bool, TransportResponse]:
    """Whether the request streams, and the upstream's answer (at its headers)."""
    body = orjson.loads(raw)
    upstream = upstreams[body["model"]]
    answer = await upstream.send("/chat/completions", body, headers={}, connect_timeout_s=None)
    return body.get("stream") is True, answer


def aiohttp_app(upstreams: Upstreams) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        stream, answer = await send(upstreams, await request.read())
        content_type = answer.headers.get("Content-Type", "application/json")
        if not stream:
            data = await answer.read()
            answer.release()
            return web.Response(status=answer.status, body=data, headers={"Content-Type": content_type})
        out = web.StreamResponse(status=answer.status, headers={"Content-Type": content_type})
        await out.prepare(request)
        try:
            async for chunk in answer.iter_chunks():
                await out.write(chunk)
            answer.release()
            await out.write_eof()
        except ConnectionResetError:  # the client left (the SDKs close at `data: [DONE]`)
            answer.close()
        return out

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/healthz", healthz)
    return app


class BareProtocol(asyncio.Protocol):
    """One client connection: httptools parses each request; a task answers it."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.answering: asyncio.Task[None] | None = None  # held: the loop keeps only a weak one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        raw, self.body = b"".join(self.body), []
        if self.url == b"/healthz":
            self.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        else:
            self.answering = asyncio.get_running_loop().create_task(self.chat(raw))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def chat(self, raw: bytes) -> None:
        stream, answer = await send(self.upstreams, raw)
        head = b"HTTP/1.1 %d -\r\nContent-Type: %s\r\n" % (
            answer.status,
            answer.headers.get("Content-Type", "application/json").encode(),
        )
        if not stream:
            data = await answer.read()
            answer.release()
            self.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(data), data))
            return
        self.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
        async for chunk in answer.iter_chunks():
            if chunk:  # an empty one would end the chunked body
                self.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer.release()
        self.write(b"0\r\n\r\n")


async def serve(server: str, upstreams: Upstreams, port: int) -> None:
    if server == "aiohttp":
        runner = web.AppRunner(aiohttp_app(upstreams), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    else:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: BareProtocol(upstreams), "127.0.0.1", port, backlog=1024)
    tune_gc()
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="a gateway policy: its deployments are the upstreams")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", choices=("aiohttp", "protocol"), default="aiohttp")
    args = parser.parse_args(argv)
    policy = load_policy(args.policy)
    upstreams = {name: Http1Transport(str(d.base_url), d) for name, d in policy.deployments.items()}
    uvloop.run(serve(args.server, upstreams, args.port))


if __name__ == "__main__":
    main()
