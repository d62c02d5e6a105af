"""A transport that answers from a function: the test double for everything above the socket.

In the spirit of httpx's ``MockTransport``: give a provider ``MockTransport(handler)``
and every request it sends calls ``handler(request)``, which returns a
:class:`MockResponse` (canned status, headers, body, or SSE chunks that may be delayed or
break off), or raises (``aiohttp.ClientConnectorError`` stands for "cannot connect").
Delays use ``asyncio.sleep``, so a test running on virtual time never waits for real::

    async def handler(request: MockRequest) -> MockResponse:
        if request.body.get("stream"):
            return MockResponse.sse([{"choices": [...]}], delay_s=0.5)
        return MockResponse.json({"choices": [...]}, status=200)

    provider = OpenAIProvider("gpt", deployment, transport=MockTransport(handler))
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.providers.transport import Transport, TransportResponse


@dataclass(slots=True)
class MockRequest:
    """What the provider sent."""

    endpoint: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]


@dataclass(slots=True)
class MockResponse(TransportResponse):
    """A canned answer: ``chunks`` are sent one by one, each after ``delay_s`` (when set);
    ``error`` is raised after the last chunk (a stream that breaks)."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    delay_s: float = 0.0
    error: BaseException | None = None
    closed: bool = False
    released: bool = False

    @classmethod
    def json(cls, obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> MockResponse:
        """A JSON body."""
        return cls(status, {"Content-Type": "application/json", **(headers or {})}, [orjson.dumps(obj)])

    @classmethod
    def sse(
        cls,
        events: Sequence[Any],
        *,
        done: bool = True,
        delay_s: float = 0.0,
        error: BaseException | None = None,
    ) -> MockResponse:
        """An SSE stream, one event per chunk (``data: [DONE]`` last unless ``done=False``)."""
        chunks = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
        if done:
            chunks.append(b"data: [DONE]\n\n")
        return cls(200, {"Content-Type": "text/event-stream"}, chunks, delay_s, error)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield chunk
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


Handler = Callable[[MockRequest], Awaitable[MockResponse]]


class MockTransport(Transport):
    """Answers each request with ``handler(request)``; keeps every request in ``requests``."""

    def __init__(self, handler: Handler, *, ready: bool = True) -> None:
        self.handler = handler
        self.requests: list[MockRequest] = []
        self.is_ready = ready
        self.closed = False

    @property
    def ready(self) -> bool:
        return self.is_ready

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        request = MockRequest(endpoint, body, headers)
        self.requests.append(request)
        return await self.handler(request)

    async def close(self) -> None:
        self.closed = True
