"""The upstream HTTP call on a plain ``asyncio.Protocol`` and httptools' C parser.

aiohttp's client spent ~190 µs of CPU per upstream request (bench/README.md, issue #20);
every upstream call here is the same shape (a JSON POST, an answer read or streamed), so a
lean HTTP/1.1 client does it in a fraction of that:

- one pool per deployment (or replica) of keep-alive connections, at most
  ``max_connections`` open; callers beyond that wait in order for one to come free;
- a connection goes back to the pool only when its answer ended and the server keeps it
  alive; one the server closed (``Connection: close``, EOF, an answer cut short), one left
  mid-answer and one idle for :data:`KEEPALIVE_S` is never used again;
- body bytes are handed on as each network read arrives (SSE is never buffered); a
  ``gzip``/``deflate`` body is decompressed, any other ``Content-Encoding`` fails;
- nothing is retried here (dispatch retries), and failures are aiohttp's exception classes,
  which dispatch's failure table (:mod:`gateway.dispatch.failures`) reads:
  ``ClientConnectorError`` when nothing was sent (refused, DNS, TLS),
  ``ConnectionTimeoutError`` (a ``TimeoutError``) past ``connect_s``,
  ``ServerDisconnectedError`` / ``ClientOSError`` when the connection ends before the
  headers, ``ClientPayloadError`` when the body is cut short or malformed.

Proxies from ``HTTP(S)_PROXY`` are not used (the aiohttp client did not use them either).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import aiohttp
import httptools
import orjson
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict

from gateway.providers.transport import Transport, TransportResponse, static_headers

if TYPE_CHECKING:
    from gateway.policy import Deployment

KEEPALIVE_S = 60.0
"""An idle connection older than this is closed instead of reused: servers close theirs
after about a minute, and a request sent as the server closes is lost (aiohttp's default)."""

READ_HIGH_WATER_BYTES = 1 << 20
"""Unread body bytes beyond which reading from the socket pauses until the reader catches up."""

_NO_HEADERS: CIMultiDict[str] = CIMultiDict()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # One context for every https upstream: building one loads the system's CA store (ms).
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


class Http1Response(TransportResponse):
    """One answer on one connection: the body is its own async iterator of network reads."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_finished",
        "_size",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
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

    # -- fed by the connection ---------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._error is not None:
            return
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
            self._conn.drop()

    def release(self) -> None:
        if not self._finished:
            self._finished = True
            if self._done and self._error is None:
                self._conn.recycle()
            else:
                self._conn.drop()


class _Connection(asyncio.Protocol):
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

    def __init__(self, pool: Http1Transport) -> None:
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
        self.pool._forget(self)
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
            self._head_failed(aiohttp.ClientPayloadError(f"unsupported Content-Encoding: {encoding}"))
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

    def _head_failed(self, error: BaseException) -> None:
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.drop()

    def _broken(self, error: BaseException) -> None:
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
            self.pool._put_idle(self)
        else:
            self.drop()

    def drop(self) -> None:
        """Close the connection; it is never used again."""
        if self.open:
            self.open = False
            if self.transport is not None:
                self.transport.close()
        self.pool._forget(self)


class Http1Transport(Transport):
    """Pooled keep-alive HTTP/1.1 connections to one base URL (a deployment or a replica).

    The API key is read once from the environment variable the policy names and is only
    ever put in the ``Authorization`` header.
    """

    def __init__(self, base_url: str, deployment: Deployment) -> None:
        url = urlsplit(base_url)
        https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if https else 80)
        self._ssl = _ssl_context() if https else None
        self._prefix = url.path.rstrip("/")
        self._key = ConnectionKey(self._host, self._port, https, True, None, None, None, self._host)
        self._headers = static_headers(deployment)
        # The request head's fixed part, encoded once; per-call headers are added per request.
        self._host_line = f"Host: {url.netloc.rpartition('@')[2]}"
        lines = [f"{self._host_line}\r\n", *(f"{k}: {v}\r\n" for k, v in self._headers.items())]
        for line in lines:
            _check_header(line[:-2])
        self._static = "".join(lines).encode()
        self._static_names = {k.lower() for k in self._headers} | {"host", "content-length"}
        self._max_connections = deployment.max_connections
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or being opened, idle ones included
        self._conns: set[_Connection] = set()
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the pool's connections belong to (the first one that sent)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        data = self._head(endpoint, headers, orjson.dumps(body))
        conn = await self._acquire(connect_timeout_s)
        try:
            await conn.request(data)
        except BaseException:
            conn.drop()
            raise
        assert conn.response is not None
        return conn.response

    def _head(self, endpoint: str, headers: Mapping[str, str], payload: bytes) -> bytes:
        static = self._static
        names = self._static_names
        extra = []
        for name, value in headers.items():
            if name.lower() in names:
                return self._head_merged(endpoint, headers, payload)
            line = f"{name}: {value}"
            _check_header(line)
            extra.append(line)
        extra.append(f"Content-Length: {len(payload)}\r\n\r\n")
        start = f"POST {self._prefix}{endpoint} HTTP/1.1\r\n"
        return b"".join((start.encode(), static, "\r\n".join(extra).encode(), payload))

    def _head_merged(self, endpoint: str, headers: Mapping[str, str], payload: bytes) -> bytes:
        # A per-call header replaces a fixed one of the same name (any case), as aiohttp did.
        merged = {k.lower(): (k, v) for k, v in self._headers.items()}
        merged.update((k.lower(), (k, v)) for k, v in headers.items())
        merged.pop("content-length", None)
        host = merged.pop("host", None)
        lines = [f"POST {self._prefix}{endpoint} HTTP/1.1"]
        lines.append(f"Host: {host[1]}" if host is not None else self._host_line)
        lines.extend(f"{k}: {v}" for k, v in merged.values())
        for line in lines[1:]:
            _check_header(line)
        lines.append(f"Content-Length: {len(payload)}\r\n\r\n")
        return "\r\n".join(lines).encode() + payload

    # -- the pool ----------------------------------------------------------------------

    async def _acquire(self, connect_timeout_s: float | None) -> _Connection:
        loop = self.loop
        while True:
            idle = self._idle
            while idle:
                conn = idle.pop()
                if conn.usable and loop.time() - conn.idle_since < KEEPALIVE_S:
                    self._conns.add(conn)
                    return conn
                conn.drop()
            if self._closed:
                raise aiohttp.ClientConnectionError("the upstream pool is closed")
            if self._open < self._max_connections:
                self._open += 1
                return await self._connect(connect_timeout_s)
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._hand_back(waiter.result())
                else:
                    self._waiters.remove(waiter)
                raise
            if handed is None:  # a free slot: open a connection in it
                return await self._connect(connect_timeout_s)
            if self._closed:
                handed.drop()
                raise aiohttp.ClientConnectionError("the upstream pool is closed")
            if handed.usable:
                return handed
            handed.drop()

    async def _connect(self, connect_timeout_s: float | None) -> _Connection:
        """Open a connection in a slot already counted in ``_open``."""
        conn = _Connection(self)
        try:
            async with asyncio.timeout(connect_timeout_s):
                await self.loop.create_connection(
                    lambda: conn,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            self._free_slot()
            raise aiohttp.ConnectionTimeoutError(
                f"connection to {self._host}:{self._port} timed out after connect_s={connect_timeout_s}"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            self._free_slot()
            raise aiohttp.ClientConnectorCertificateError(self._key, exc) from None
        except ssl.SSLError as exc:
            self._free_slot()
            raise aiohttp.ClientConnectorSSLError(self._key, exc) from None
        except OSError as exc:
            self._free_slot()
            error = aiohttp.ClientConnectorDNSError if _is_dns_error(exc) else aiohttp.ClientConnectorError
            raise error(self._key, exc) from None
        except BaseException:
            self._free_slot()
            raise
        self._conns.add(conn)
        return conn

    def _put_idle(self, conn: _Connection) -> None:
        if self._closed:
            conn.drop()
            return
        if self._waiters:
            self._waiters.popleft().set_result(conn)
            return
        self._conns.discard(conn)
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def _hand_back(self, conn: _Connection | None) -> None:
        # A waiter was handed a connection (or a slot) and cancelled before it took it.
        if conn is None:
            self._free_slot()
        elif conn.open:
            self._put_idle(conn)
        else:
            conn.drop()

    def _forget(self, conn: _Connection) -> None:
        """``conn`` closed: its slot is free (counted once, however many times it is closed)."""
        if conn.pool is not self:
            return
        conn.pool = _GONE
        self._conns.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        self._free_slot()

    def _free_slot(self) -> None:
        if self._waiters and not self._closed:
            self._waiters.popleft().set_result(None)  # the slot passes to the first waiter
        else:
            self._open -= 1

    async def close(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._conns]:
            conn.drop()
        while self._waiters:
            self._waiters.popleft().set_exception(
                aiohttp.ClientConnectionError("the upstream pool is closed")
            )


class _Gone:
    """The pool of a closed connection: closing it again frees nothing."""

    def _forget(self, conn: _Connection) -> None:
        pass


_GONE: Any = _Gone()


def _check_header(line: str) -> None:
    if "\r" in line or "\n" in line:
        raise ValueError(f"a header holds a line break: {line[:80]!r}")


def _is_dns_error(exc: OSError) -> bool:
    return isinstance(exc, socket.gaierror)
