"""Chat chunks written as the Responses API's typed events: the simulator's native
``/v1/responses`` stream is its chat generation (or a canned fault's chunks) seen through
the gateway's own chat-to-Responses translation."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.dialects.responses.stream import ChatToResponsesScanner
from gateway.providers.sse import StreamScanner


class EventWriter:
    """Stands in for the stream response that chat chunks are written to: chat chunks in,
    Responses events out. ``raw`` is a fault's bad event (a malformed chunk): it goes out
    as it is, once each time it is written, and the translation goes on after it."""

    def __init__(self, resp: web.StreamResponse, request: dict[str, Any], model: str, raw: bytes) -> None:
        self._resp = resp
        self._raw = raw
        self._scanner = ChatToResponsesScanner(request, StreamScanner(), model)

    async def write(self, data: bytes) -> None:
        """Translate and write ``data`` (whole chat events: the bad one is never cut in two)."""
        head, bad, rest = data.partition(self._raw)
        out = self._scanner.feed(head)
        if bad:
            out += bad + self._scanner.feed(rest)
        if out:
            await self._resp.write(out)

    async def write_eof(self, data: bytes = b"") -> None:
        """End the real response."""
        await self._resp.write_eof(data)
