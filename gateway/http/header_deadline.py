"""A deadline for a request's headers, which aiohttp does not bound: a client sending them
a byte at a time would hold its connection (and a slot) for aiohttp's keep-alive hour.

The deadline runs from the connection's start, or from the first byte after the previous
answer (an idle keep-alive connection is not a slow client). Past it the connection is
closed, after a 408 in OpenAI's error JSON when the client had started a request. The
body's own deadline is the middleware's (:mod:`gateway.http.middleware`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp.web_protocol import RequestHandler

from gateway.errors import InvalidRequestError

_log = structlog.get_logger("switchyard")


class HeaderDeadlineHandler(RequestHandler):
    """aiohttp's connection handler with ``header_timeout_s`` for each request's headers."""

    header_timeout_s = 10.0
    _header_deadline: asyncio.TimerHandle | None = None
    _between_requests = True
    _started_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        # Bytes between two requests start the next one's headers: from the first of them,
        # the headers have header_timeout_s to arrive in full. Most requests arrive whole in
        # one read, so the timer is armed only when they did not (it starts a parse later,
        # microseconds): a timer per request cost more than the rest of this handler.
        parsed = self._request_count
        super().data_received(data)
        if self._request_count > parsed:
            self._between_requests = self._started_request = False
            self._disarm_header_deadline()
        elif self._between_requests and data:
            self._started_request = True
            self._arm_header_deadline()

    async def _handle_request(self, *args: Any, **kw: Any) -> Any:
        try:
            return await super()._handle_request(*args, **kw)
        finally:
            self._between_requests = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is None:
            loop = asyncio.get_running_loop()
            self._header_deadline = loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_timed_out(self) -> None:
        self._header_deadline = None
        if not self._between_requests or self.transport is None:
            return  # a request is being handled: its body has its own deadline
        if not self._started_request:
            self.force_close()  # connected and never sent a byte: nobody to answer
            return
        _log.info("request_header_timeout", timeout_s=self.header_timeout_s)
        err = InvalidRequestError(
            f"The request headers were not received within {self.header_timeout_s:g} s.",
            code="request_timeout",
        )
        body = err.to_json()
        head = (
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nx-should-retry: false\r\nConnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.force_close()  # closing the transport sends what was written first
