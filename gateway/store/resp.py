"""A minimal Redis client for the response cache's request path: ``GET``, ``SET ... PX``,
``DEL`` on one pipelined connection, speaking RESP2 over an asyncio Protocol.

A cache miss must cost the request almost nothing over the cache off (issue #55: 30 µs
of CPU), and redis-py's asyncio client spends 150-300 µs of CPU per command (a pool
checkout, a stream reader, a retry wrapper, timeout contexts, a task per store). Here a
lookup is one future; the commands of one turn of the event loop leave in one write, at
its end (so do their replies, in one read); a store has no future (its reply is only
checked) and leaves at the end of its turn too, unless the connection wrote in the last
``_HOLD_S``: then with the next write, at most ``_HOLD_S`` after the last one (a steady
stream of stores costs one write, and one read of the replies, per ``_HOLD_S``, not two
wakes of the process per store); replies are parsed in ``data_received``.

The bound is the request path's :class:`~gateway.store.gate.RedisGate`: a command not
answered within ``gate.timeout_s`` (and two more turns of the event loop, as the gate
allows) fails with :class:`TimeoutError`, and so does every command behind it on the
connection, which is closed (Redis answers in order: a frozen head means a frozen
connection). One timer per connection watches the oldest command, not one per command.
A closed or refused connection fails its commands with :class:`ConnectionError`; the next
command opens a new one. Every fault is counted by the gate, so callers that check
:attr:`RedisGate.unreachable` stop asking a failing Redis for ``retry_s``.

The connection is the one redis-py would open for the same URL (:func:`redis.connection.parse_url`:
host and port or unix socket, ``AUTH`` with the URL's user and password, ``SELECT`` of its
database). TLS (``rediss://``) and Redis Cluster URLs are not spoken here:
:func:`fast_client` returns None for them and the cache keeps using redis-py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from redis.connection import UnixDomainSocketConnection, parse_url
from redis.exceptions import ResponseError

from gateway.store.gate import RedisGate

__all__ = ["RespClient", "encode_command", "fast_client"]

_HANDSHAKE: Any = object()
"""The waiter of an ``AUTH`` or ``SELECT`` sent when the connection opens."""

_GET = b"*2\r\n$3\r\nGET\r\n$"
_DEL = b"*2\r\n$3\r\nDEL\r\n$"
_SET = b"*5\r\n$3\r\nSET\r\n$"
_PTTL = b"*2\r\n$4\r\nPTTL\r\n$"
_HOLD_S = 0.005
"""How long after a write a store may wait for company (at most a quarter of the bound)."""


def encode_command(*args: bytes) -> bytes:
    """A command as RESP2 sends it: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in args)


_PING = encode_command(b"PING")


def fast_client(url: str, gate: RedisGate) -> RespClient | None:
    """A :class:`RespClient` for ``url`` (``redis://`` or ``unix://``), bounded by ``gate``;
    None for a URL it does not speak (TLS, Redis Cluster): use redis-py for those."""
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "unix"):
        return None
    try:
        options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        return None
    handshake = []
    password = options.get("password")
    if password is not None:
        username = options.get("username")
        auth = [b"AUTH"] + ([username.encode()] if username else []) + [password.encode()]
        handshake.append(encode_command(*auth))
    db = int(options.get("db") or 0)
    if db:
        handshake.append(encode_command(b"SELECT", b"%d" % db))
    if options.get("connection_class") is UnixDomainSocketConnection:
        return RespClient(gate, path=options["path"], handshake=handshake)
    host, port = options.get("host") or "localhost", int(options.get("port") or 6379)
    return RespClient(gate, host=host, port=port, handshake=handshake)


class RespClient:
    """``get``, ``set`` and ``delete`` of byte values over one pipelined connection.

    ``get`` returns a future (await it: bytes, None for a missing key, or one of the
    gate's faults); ``set`` and ``delete`` send and return at once, their replies only
    checked for faults. :meth:`sync` waits until every command sent so far is answered.
    :attr:`on_lost` is called when a connection is lost (the response cache's local view
    then stops trusting it: tracking lived on that connection).
    """

    def __init__(
        self,
        gate: RedisGate,
        *,
        host: str = "",
        port: int = 0,
        path: str = "",
        handshake: list[bytes] | None = None,
    ) -> None:
        self.gate = gate
        self.host, self.port, self.path = host, port, path
        self.handshake = handshake or []
        """``AUTH`` and ``SELECT`` as the URL asks, sent first on every connection."""
        self._conn: _Connection | None = None
        self.connects = 0
        """Connections opened, since start (one, while Redis stays up)."""
        self.on_lost: Callable[[], None] | None = None

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = _Connection(self, asyncio.get_running_loop())
            self.connects += 1
        return conn

    def get(self, key: str) -> asyncio.Future[bytes | None]:
        """The value under ``key`` (None when missing), as a future."""
        conn = self._connection()
        k = key.encode()
        fut: asyncio.Future[bytes | None] = conn.loop.create_future()
        conn.send(b"%b%d\r\n%b\r\n" % (_GET, len(k), k), fut)
        return fut

    def get_pttl(self, key: str) -> tuple[asyncio.Future[bytes | None], asyncio.Future[int]]:
        """``GET key`` and ``PTTL key`` in the same write: the value and its milliseconds
        left (-1: no expiry, -2: no such key)."""
        fut = self.get(key)
        conn = self._connection()  # the one the GET went to: sent in the same turn
        k = key.encode()
        ttl: asyncio.Future[int] = conn.loop.create_future()
        conn.send(b"%b%d\r\n%b\r\n" % (_PTTL, len(k), k), ttl)
        return fut, ttl

    def command(self, *args: bytes) -> asyncio.Future[Any]:
        """Any command whose reply is a status, an integer or a bulk string, as a future. An
        error reply is the caller's to judge (a command this Redis refuses), not counted as
        Redis failing; a timeout or a lost connection is, as for every command."""
        conn = self._connection()
        fut: asyncio.Future[Any] = conn.loop.create_future()
        conn.quiet.add(fut)
        conn.send(encode_command(*args), fut)
        return fut

    def set(self, key: str, value: bytes, px_ms: int) -> None:
        """``SET key value PX px_ms``, not waited for (a failure is counted by the gate)."""
        k, ttl = key.encode(), b"%d" % px_ms
        data = b"%b%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nPX\r\n$%d\r\n%b\r\n" % (
            _SET, len(k), k, len(value), value, len(ttl), ttl,
        )  # fmt: skip
        self._connection().send_later(data)

    def delete(self, key: str) -> None:
        """``DEL key``, not waited for."""
        k = key.encode()
        self._connection().send_later(b"%b%d\r\n%b\r\n" % (_DEL, len(k), k))

    async def sync(self) -> None:
        """Return once Redis has answered every command sent before (or the connection
        failed): a ``PING`` behind them, since Redis answers in order."""
        conn = self._conn
        if conn is None or conn.closed or not conn.waiters:
            return
        fut: asyncio.Future[Any] = conn.loop.create_future()
        conn.send(_PING, fut)
        try:
            await fut
        except (OSError, TimeoutError, ResponseError):
            return

    def close(self) -> None:
        """Close the connection; commands still waiting fail with :class:`ConnectionError`."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort(ConnectionError("the Redis client was closed"))


class _Connection(asyncio.Protocol):
    """One connection: the commands sent and not yet answered, in order, and the parser."""

    def __init__(self, client: RespClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.gate = client.gate
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.unsent: list[bytes] = []
        """Commands not written yet (written together; on connecting, after the handshake)."""
        self.waiters: deque[tuple[Any, float]] = deque()
        """Per command not yet answered: its future (None: nobody waits) and when it was sent."""
        self.answered = 0
        self.timer: asyncio.Handle | None = None
        """The watch on the oldest command's deadline."""
        self.flusher: asyncio.Handle | None = None
        """The write of :attr:`unsent`: at the end of this turn, or a store's later one."""
        self.quiet: set[Any] = set()
        """The futures of :meth:`RespClient.command`'s commands not answered yet."""
        self.soon = False
        self.written = -1.0
        """When :attr:`unsent` was last written (the loop's clock)."""
        self.rest = b""
        self.opening = loop.create_task(self._open())

    async def _open(self) -> None:
        client = self.client
        try:
            if client.path:
                await self.loop.create_unix_connection(lambda: self, client.path)
            else:
                await self.loop.create_connection(lambda: self, client.host, client.port)
        except (OSError, ValueError) as exc:  # refused, unreachable, no such socket, a bad host
            self.abort(exc)

    # The commands

    def send(self, data: bytes, fut: Any) -> None:
        """Write ``data`` at the end of this turn of the loop, with every command sent in
        it and the stores held back, in one write; ``fut`` gets its reply."""
        self.unsent.append(data)
        if not self.soon:
            self.soon = True
            if self.flusher is not None:
                self.flusher.cancel()
            self.flusher = self.loop.call_soon(self._flush)
        now = self.loop.time()
        self.waiters.append((fut, now))
        if self.timer is None:
            self.timer = self.loop.call_at(now + self.gate.timeout_s, self._watch)

    def send_later(self, data: bytes) -> None:
        """Write ``data`` at the end of this turn, or, when the connection wrote in the last
        ``_HOLD_S``, with the next write, at most ``_HOLD_S`` after the last one."""
        self.unsent.append(data)
        now = self.loop.time()
        self.waiters.append((None, now))
        if self.timer is None:
            self.timer = self.loop.call_at(now + self.gate.timeout_s, self._watch)
        if self.flusher is None:
            hold = min(_HOLD_S, self.gate.timeout_s / 4)
            if now - self.written >= hold:
                self.soon = True
                self.flusher = self.loop.call_soon(self._flush)
            else:
                self.flusher = self.loop.call_at(self.written + hold, self._flush)

    def _flush(self) -> None:
        self.soon = False
        self.flusher = None
        if self.unsent and self.transport is not None:
            self.written = self.loop.time()
            self.transport.write(b"".join(self.unsent))
            self.unsent = []

    def _watch(self) -> None:
        """The oldest command's deadline: past it, two more turns, then the connection fails."""
        self.timer = None
        if self.closed or not self.waiters:
            return
        deadline = self.waiters[0][1] + self.gate.timeout_s
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._watch)
        else:
            # Its answer may already be read in this very turn: the bound is for Redis's
            # slowness, not for this process's own (as the gate's own bound).
            self.timer = self.loop.call_soon(self._overdue, self.answered, 2)

    def _overdue(self, answered: int, turns: int) -> None:
        self.timer = None
        if self.closed or not self.waiters:
            return
        if self.answered != answered:
            self._watch()
        elif turns:
            self.timer = self.loop.call_soon(self._overdue, answered, turns - 1)
        else:
            timeout_ms = self.gate.timeout_s * 1000
            self.abort(TimeoutError(f"Redis did not answer within {timeout_ms:g} ms"))

    def abort(self, exc: BaseException) -> None:
        """Close the connection, failing every command still waiting with ``exc``'s kind."""
        if self.closed:
            return
        self.closed = True
        for timer in (self.timer, self.flusher):
            if timer is not None:
                timer.cancel()
        self.timer = self.flusher = None
        self.unsent = []
        if not self.opening.done() and self.opening is not asyncio.current_task():
            self.opening.cancel()
        if self.transport is not None:
            self.transport.abort()
        waiters, self.waiters = self.waiters, deque()
        if waiters:
            self.gate.failed(exc)
        if self.client.on_lost is not None:
            self.client.on_lost()
        kind = type(exc) if isinstance(exc, TimeoutError | ResponseError) else ConnectionError
        for fut, _ in waiters:
            if fut is not None and fut is not _HANDSHAKE and not fut.done():
                fut.set_exception(kind(str(exc)))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the handshake, then the commands that waited for the connection."""
        if self.closed:
            transport.abort()  # type: ignore[attr-defined]
            return
        # uvloop's transports are not asyncio.Transport instances, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        handshake = self.client.handshake
        if handshake:
            # The handshake's replies come first: so must its waiters.
            sent = self.waiters[0][1] if self.waiters else self.loop.time()
            self.waiters.extendleft([(_HANDSHAKE, sent)] * len(handshake))
        transport.write(b"".join([*handshake, *self.unsent]))
        self.unsent = []

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail the commands still waiting; the next command opens a new connection."""
        self.abort(exc if exc is not None else ConnectionError("Redis closed the connection"))

    def eof_received(self) -> bool:
        """Redis closed its side: close ours (the commands waiting will never be answered)."""
        return False

    def data_received(self, data: bytes) -> None:
        """Parse every whole reply in ``data`` (and what was left of the last), in order."""
        if self.rest:
            data = self.rest + data
            self.rest = b""
        pos, end = 0, len(data)
        while pos < end:
            nl = data.find(b"\r\n", pos)
            if nl < 0:
                break
            kind = data[pos]
            value: Any
            if kind == 36:  # $: a bulk string, or -1 for none
                size = int(data[pos + 1 : nl])
                if size < 0:
                    value, pos = None, nl + 2
                else:
                    stop = nl + 2 + size
                    if stop + 2 > end:
                        break
                    value, pos = data[nl + 2 : stop], stop + 2
            elif kind == 43:  # +, a status
                value, pos = True, nl + 2
            elif kind == 58:  # :, an integer
                value, pos = int(data[pos + 1 : nl]), nl + 2
            elif kind == 45:  # -, an error
                value, pos = ResponseError(data[pos + 1 : nl].decode(errors="replace")), nl + 2
            else:
                # Nothing sent here is answered with an array or RESP3: the stream is lost.
                self.abort(ConnectionError(f"unexpected reply from Redis: {data[pos:nl][:40]!r}"))
                return
            self._answer(value)
            if self.closed:
                return
        if pos < end:
            self.rest = data[pos:]

    def _answer(self, value: Any) -> None:
        if not self.waiters:
            self.abort(ConnectionError("a reply from Redis to no command"))
            return
        fut, _ = self.waiters.popleft()
        self.answered += 1
        if type(value) is ResponseError:
            if fut is _HANDSHAKE:
                self.abort(value)  # a wrong password or database: every command would fail
                return
            if fut in self.quiet:
                self.quiet.discard(fut)
                if not fut.done():
                    fut.set_exception(value)
                return
            self.gate.failed(value)
            if fut is not None and not fut.done():
                fut.set_exception(value)
            return
        self.gate.answered()
        if self.quiet:
            self.quiet.discard(fut)
        if fut is not None and fut is not _HANDSHAKE and not fut.done():
            fut.set_result(value)
