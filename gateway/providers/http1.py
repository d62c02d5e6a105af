"""The upstream HTTP call's pool: keep-alive HTTP/1.1 connections
(:mod:`gateway.providers.http1_connection`, a plain ``asyncio.Protocol`` and httptools' C
parser) to one base URL.

aiohttp's client spent ~190 µs of CPU per upstream request (bench/probes/upstream_client.py);
every upstream call here is the same shape (a JSON POST, an answer read or streamed), so a
lean HTTP/1.1 client does it in a fraction of that:

- one pool per deployment (or replica) of keep-alive connections, at most
  ``max_connections`` open; callers beyond that wait in order for one to come free;
- a connection goes back to the pool only when its answer ended and the server keeps it
  alive; one the server closed (``Connection: close``, EOF, an answer cut short), one left
  mid-answer and one idle for :data:`KEEPALIVE_S` is never used again;
- a host name's addresses are looked up once per :data:`DNS_TTL_S` and tried in turn;
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
import ipaddress
import socket
import ssl
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp.client_reqrep import ConnectionKey

from gateway.providers.http1_connection import GONE, Connection
from gateway.providers.transport import Transport, TransportResponse, static_headers

if TYPE_CHECKING:
    from gateway.policy import Deployment

DNS_TTL_S = 300.0
"""How long a host name's addresses are reused before they are looked up again (as the aiohttp
client was configured): a burst of new connections then costs one lookup, not one each."""

KEEPALIVE_S = 60.0
"""An idle connection older than this is closed instead of reused: servers close theirs
after about a minute, and a request sent as the server closes is lost (aiohttp's default)."""


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # One context for every https upstream: building one loads the system's CA store (ms).
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


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
        # A policy header with a line break fails each request (as it did with aiohttp), not
        # the policy load that builds this transport.
        self._bad_header = next((line for line in lines if "\r" in line[:-2] or "\n" in line[:-2]), None)
        self._static = "".join(lines).encode()
        self._static_names = {k.lower() for k in self._headers} | {"host", "content-length"}
        self._max_connections = deployment.max_connections
        self._idle: list[Connection] = []
        self._open = 0  # connections open or being opened, idle ones included
        self._conns: set[Connection] = set()
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._addresses: list[str] = [self._host] if _is_ip(self._host) else []
        self._addresses_until = float("inf") if self._addresses else 0.0
        self._lookup: asyncio.Future[list[str]] | None = None

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
        if self._bad_header is not None:
            _check_header(self._bad_header[:-2])
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

    async def _acquire(self, connect_timeout_s: float | None) -> Connection:
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
            waiter: asyncio.Future[Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._hand_back(waiter.result())
                elif waiter in self._waiters:
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

    async def _connect(self, connect_timeout_s: float | None) -> Connection:
        """Open a connection in a slot already counted in ``_open`` (the name lookup included
        in ``connect_timeout_s``); the host's addresses are tried in turn."""
        conn = Connection(self)
        try:
            async with asyncio.timeout(connect_timeout_s):
                addresses = await self._resolve()
                for i, address in enumerate(addresses):
                    try:
                        await self.loop.create_connection(
                            lambda: conn,
                            address,
                            self._port,
                            ssl=self._ssl,
                            server_hostname=self._host if self._ssl is not None else None,
                        )
                        break
                    except ssl.SSLError:
                        raise  # the host's certificate or TLS, not this address
                    except OSError:
                        if i == len(addresses) - 1:
                            raise
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

    async def _resolve(self) -> list[str]:
        """The host's addresses, looked up at most once per :data:`DNS_TTL_S` (callers that
        ask while a lookup runs share it)."""
        loop = self.loop
        if loop.time() < self._addresses_until:
            return self._addresses
        if self._lookup is None:
            self._lookup = asyncio.ensure_future(self._look_up())
            self._lookup.add_done_callback(self._looked_up)
        return await asyncio.shield(self._lookup)

    async def _look_up(self) -> list[str]:
        found = await self.loop.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
        )
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"no address for {self._host}")
        return addresses

    def _looked_up(self, lookup: asyncio.Future[list[str]]) -> None:
        self._lookup = None
        if not lookup.cancelled() and lookup.exception() is None:
            self._addresses = lookup.result()
            self._addresses_until = self.loop.time() + DNS_TTL_S

    def put_idle(self, conn: Connection) -> None:
        """``conn`` finished an answer: to the first caller waiting, else to the idle list."""
        if self._closed:
            conn.drop()
            return
        if self._hand_over(conn):
            return
        self._conns.discard(conn)
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def _hand_back(self, conn: Connection | None) -> None:
        # A waiter was handed a connection (or a slot) and cancelled before it took it.
        if conn is None:
            self._free_slot()
        elif conn.open:
            self.put_idle(conn)
        else:
            conn.drop()

    def forget(self, conn: Connection) -> None:
        """``conn`` closed: its slot is free (counted once, however many times it is closed)."""
        if conn.pool is not self:
            return
        conn.pool = GONE
        self._conns.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        self._free_slot()

    def _free_slot(self) -> None:
        # The slot passes to the first caller waiting (to open a connection in), if any.
        if self._closed or not self._hand_over(None):
            self._open -= 1

    def _hand_over(self, conn: Connection | None) -> bool:
        """Give ``conn`` (``None``: a free slot) to the first caller still waiting."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # a cancelled caller's future stays queued until it runs
                waiter.set_result(conn)
                return True
        return False

    async def close(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._conns]:
            conn.drop()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(aiohttp.ClientConnectionError("the upstream pool is closed"))


def _check_header(line: str) -> None:
    if "\r" in line or "\n" in line:
        raise ValueError(f"a header holds a line break: {line[:80]!r}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_dns_error(exc: OSError) -> bool:
    return isinstance(exc, socket.gaierror)
