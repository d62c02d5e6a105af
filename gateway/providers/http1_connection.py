"""One HTTP/1.1 connection of the upstream client: an ``asyncio.Protocol`` fed to httptools'
C parser, and the :class:`Http1Response` it fills (one request at a time).

The pool that owns connections is :class:`gateway.providers.http1.Http1Transport`; a
connection only tells it when it closes (:meth:`Owner.forget`) or can take another request
(:meth:`Owner.put_idle`).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping
from typing import Any, Protocol, cast

import aiohttp
import httptools
from multidict import CIMultiDict

from gateway.providers.transport import TransportResponse

READ_HIGH_WATER_BYTES = 256 * 1024
"""Unread body bytes beyond which reading from the socket pauses until the reader catches up."""

_NO_HEADERS: CIMultiDict[str] = CIMultiDict()


class Owner(Protocol):
    """What a connection needs of its pool."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the connection runs on."""

    def forget(self, conn: Connection) -> None:
        """``conn`` closed: its slot is free."""

    def put_idle(self, conn: Connection) -> None:
        """``conn`` finished an answer and may carry another request."""


class Http1Response(TransportResponse):
    """One answer on one connection: the body is its own async iterator of network reads."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_draining",
        "_error",
        "_finished",
        "_size",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: Mapping[str, str] = _NO_HEADERS
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False  # the body's end arrived
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: Any = None  # a zlib decompressor for a gzip/deflate body
        self._finished = False  # closed or released
        self._draining: asyncio.TimerHandle | None = None  # release_at_end's deadline

    # -- fed by the connection ---------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._error is not None or self._draining is not None:
            return  # nobody reads a drained body: its bytes are dropped
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as exc:
                self._fail(aiohttp.ClientPayloadError(f"cannot decompress the body: {exc}"))
                self._conn.drop()
                return
            if not data:
                return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > READ_HIGH_WATER_BYTES:
            self._conn.pause_reading()
        self._wake()

    def _end(self) -> None:
        if self._draining is not None:
            self._done = True
            self.release()  # the end came: the connection can carry the next request
            return
        if self._decoder is not None and self._error is None:
            tail = self._decoder.flush()
            if not self._decoder.eof:
                self._fail(aiohttp.ClientPayloadError("the compressed body ended early"))
                return
            if tail:
                self._chunks.append(tail)
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = error
            if self._draining is not None:
                self.close()
                return
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- TransportResponse -------------------------------------------------------------

    def __aiter__(self) -> Http1Response:
        return self

    async def __anext__(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                if self._size > READ_HIGH_WATER_BYTES:
                    self._conn.resume_reading()
                self._size = 0
                return data
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            waiter = self._waiter = self._conn.loop.create_future()
            await waiter

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    def iter_chunks(self) -> Http1Response:
        # The response itself, not an async generator around it: one layer less per chunk.
        return self

    def complete(self) -> bool:
        return self._done and not self._chunks

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            self._stop_draining()
            self._conn.drop()

    def release(self) -> None:
        if not self._finished:
            self._finished = True
            self._stop_draining()
            if self._done and self._error is None:
                self._conn.recycle()
            else:
                self._conn.drop()

    def release_at_end(self, within_s: float) -> bool:
        # A timer and the parser's end callback instead of a task reading the body out.
        if self._finished:
            return True
        if self._done or self._error is not None:
            self.release()
            return True
        self._chunks = []
        if self._size > READ_HIGH_WATER_BYTES:
            self._conn.resume_reading()
        self._size = 0
        self._draining = self._conn.loop.call_later(within_s, self.close)
        return True

    def _stop_draining(self) -> None:
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and its parser; one request at a time."""

    __slots__ = (
        "_head_waiter",
        "_interim",
        "_paused",
        "_raw_headers",
        "ends_at_eof",
        "idle_since",
        "keep_alive",
        "loop",
        "open",
        "parser",
        "pool",
        "response",
        "transport",
    )

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Http1Response | None = None
        self._head_waiter: asyncio.Future[None] | None = None
        self._raw_headers: list[tuple[str, str]] = []
        self._interim = False
        self._paused = False
        self.open = True
        self.keep_alive = False
        self.ends_at_eof = False
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.response._done:
            # Bytes no request asked for: what the connection carries next is unknown.
            self.drop()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(aiohttp.ClientPayloadError(f"invalid HTTP response: {exc}"))

    def eof_received(self) -> None:
        self.open = False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.pool.forget(self)
        response = self.response
        if response is None:
            return
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                aiohttp.ServerDisconnectedError()
                if exc is None
                else aiohttp.ClientOSError(getattr(exc, "errno", None), f"connection lost: {exc!r}")
            )
        elif not response._done:
            if self.ends_at_eof and exc is None:
                response._end()
            else:
                detail = f": {exc!r}" if exc is not None else ""
                response._fail(aiohttp.ClientPayloadError(f"Response payload is not completed{detail}"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        raw, self._raw_headers = self._raw_headers, []
        if status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the answer follows
            return
        response = self.response
        assert response is not None
        response.status = status
        headers = CIMultiDict(raw)
        response.headers = headers
        encoding = headers.get("Content-Encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            # wbits 47: a gzip or zlib header, whichever the body has.
            response._decoder = zlib.decompressobj(wbits=47)
        elif encoding != "identity":
            self._broken(aiohttp.ClientPayloadError(f"unsupported Content-Encoding: {encoding}"))
            return
        self.ends_at_eof = (
            "Content-Length" not in headers
            and "chunked" not in headers.get("Transfer-Encoding", "").lower()
            and status not in (204, 304)
        )
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()
        if self.response is not None:
            self.response._end()

    # -- used by the transport and the response ----------------------------------------

    def _broken(self, error: BaseException) -> None:
        """Fail the request (before its headers) or its body with ``error``; the connection
        is dropped."""
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        elif self.response is not None:
            self.response._fail(error)
        self.drop()

    def request(self, data: bytes) -> asyncio.Future[None]:
        """Send one request; the future is done when the answer's headers have arrived."""
        assert self.transport is not None
        self.response = Http1Response(self)
        self.keep_alive = False
        self._raw_headers = []  # a chunked body's trailers of the last answer are not this one's
        waiter = self._head_waiter = self.loop.create_future()
        try:
            self.transport.write(data)
        except (OSError, RuntimeError) as exc:  # closed under us
            self.drop()
            raise aiohttp.ClientOSError(getattr(exc, "errno", None), f"cannot send: {exc!r}") from None
        return waiter

    @property
    def usable(self) -> bool:
        """Open, and not closing under us (an EOF seen by the transport but not yet by us)."""
        return self.open and self.transport is not None and not self.transport.is_closing()

    def pause_reading(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def recycle(self) -> None:
        """Back to the pool if the server keeps the connection alive, else closed."""
        if self.usable and self.keep_alive and not self._paused:
            self.response = None
            self._head_waiter = None
            self.pool.put_idle(self)
        else:
            self.drop()

    def drop(self) -> None:
        """Close the connection; it is never used again."""
        if self.open:
            self.open = False
            if self.transport is not None:
                self.transport.close()
        self.pool.forget(self)


class _Gone:
    """The pool of a closed connection: closing it again frees nothing."""

    def forget(self, conn: Connection) -> None:
        pass


GONE: Any = _Gone()
"""The pool of a connection that closed (it frees its slot once)."""
