"""Keeps the response cache's :class:`~gateway.cache.view.LocalView` right, with Redis's
server-assisted client-side caching in broadcast mode (Redis 6 and later).

Three connections: the cache's own (:class:`~gateway.store.resp.RespClient`, which writes
the entries) runs ``CLIENT TRACKING ON REDIRECT <id> BCAST PREFIX sy:rc: NOLOOP``, where
``<id>`` is a second connection's, subscribed to ``__redis__:invalidate`` (RESP2's form of
the invalidation messages, read here with asyncio's streams: redis-py's parser keeps a
subscription's replies to itself); then the existing keys are read once with ``SCAN``
(through redis-py, a third). From then on Redis sends, for every key under the prefix
that another client changes (a store, a purge, its own expiry or eviction, as Redis's
expire.c and evict.c signal them; ``FLUSHALL`` or any database's ``FLUSHDB`` as one null
message, after which the view scans again), an
invalidation to the subscriber; this process's own writes are not sent back
(``NOLOOP``): it updates the view itself.

The view answers only while Redis was heard from in the last ``lease_s`` (1.5 s; a
``PING`` goes to the subscriber after ``ping_s``, 0.5 s, of silence): a frozen Redis, or a
network cut between this process and Redis (while other gateways may still purge), stops
the view answering within ``lease_s``. Any fault stops it answering until tracking is on
again and the scan has run again: the subscriber lost (a killed Redis, ``CLIENT KILL``,
silent for ``2 * lease_s``), the cache's connection lost (tracking lives and dies with
it), the view over its bound. Meanwhile lookups ask Redis as without a view. A Redis that
refuses the commands (older than 6, or an ACL) leaves the view off for good, with one
warning.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.cache.key import PREFIX
from gateway.cache.view import LocalView
from gateway.store.gate import REDIS_FAULTS
from gateway.store.resp import RespClient, encode_command

__all__ = ["INVALIDATE", "Tracker"]

INVALIDATE = "__redis__:invalidate"
"""The channel Redis publishes a redirected client's invalidations on (RESP2)."""

_log = structlog.get_logger("switchyard.cache")

_SCAN_COUNT = 1000
_CONNECT_S = 5.0
_REFUSED_FIX = (
    "the local view of the response cache is off (every lookup asks Redis): give the gateway's "
    "Redis user CLIENT TRACKING, CLIENT ID, SUBSCRIBE to __redis__:invalidate and SCAN"
)
_CLIENT_ID = encode_command(b"CLIENT", b"ID")
_SUBSCRIBE = encode_command(b"SUBSCRIBE", INVALIDATE.encode())
_PING = encode_command(b"PING")
_FAULTS: tuple[type[BaseException], ...] = (
    *REDIS_FAULTS,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
)


class Tracker:
    """Sets up and watches the tracking that keeps ``view`` right (see the module's doc)."""

    def __init__(
        self,
        redis: Redis,
        fast: RespClient,
        view: LocalView,
        *,
        retry_s: float = 1.0,
        overflow_retry_s: float = 60.0,
        ping_s: float = 0.5,
        lease_s: float = 1.5,
    ) -> None:
        self._redis = redis
        self._fast = fast
        self._view = view
        self._retry_s = retry_s
        self._overflow_retry_s = overflow_retry_s
        self._ping_s = ping_s
        self._lease_s = lease_s
        self._wanted = asyncio.Event()
        self._lost = asyncio.Event()
        view.on_reset = self._lost.set
        fast.on_lost = view.reset
        self.client_id: int | None = None
        """The subscriber's client id (the one tracking redirects to), while connected."""
        self.sessions = 0
        """Subscriber connections opened, since start."""
        self._scanned = 0
        """Keys the last scan found."""

    def want(self) -> None:
        """Start tracking (at the cache's first lookup: a gateway without the cache on
        opens no connection for it)."""
        self._wanted.set()

    async def run(self) -> None:
        """Track until cancelled, setting tracking up again after every fault."""
        await self._wanted.wait()
        if not await self._supported():
            return
        while True:
            try:
                await self._session()
            except ResponseError as exc:
                # Not Redis failing: Redis refusing (an ACL without CLIENT, SUBSCRIBE or SCAN).
                _log.warning("cache_view_refused", error=str(exc)[:200], fix=_REFUSED_FIX)
                self.client_id = None
                self._view.reset()
                return
            except _FAULTS as exc:
                _log.info("cache_view_lost", error=type(exc).__name__, detail=str(exc)[:200])
            self.client_id = None
            self._view.reset()
            await asyncio.sleep(self._retry_s)

    async def _supported(self) -> bool:
        while True:
            try:
                info = await self._redis.info("server")
                break
            except REDIS_FAULTS:
                await asyncio.sleep(self._retry_s)
        version = str(info.get("redis_version", "0"))
        try:
            major = int(version.split(".")[0])
        except ValueError:
            major = 0
        if major >= 6:
            return True
        _log.warning("cache_view_unsupported", redis_version=version, needs="Redis 6 or later")
        return False

    async def _session(self) -> None:
        """One subscriber connection: tracking on, the scan, then invalidations until a fault."""
        fast = self._fast
        connecting = (
            asyncio.open_unix_connection(fast.path)
            if fast.path
            else asyncio.open_connection(fast.host, fast.port)
        )
        sub, out = await asyncio.wait_for(connecting, _CONNECT_S)
        reader: asyncio.Task[None] | None = None
        try:
            self.sessions += 1
            out.write(b"".join([*fast.handshake, _CLIENT_ID, _SUBSCRIBE]))
            async with asyncio.timeout(_CONNECT_S):
                for _ in fast.handshake:
                    await _reply(sub)
                client_id = await _reply(sub)
                await _reply(sub)
            if not isinstance(client_id, int):
                raise ConnectionError(f"CLIENT ID answered {client_id!r}")
            self.client_id = client_id
            heard = [asyncio.get_running_loop().time()]
            self._view.renew(self._view.clock() + self._lease_s)
            reader = asyncio.create_task(self._read(sub, heard))
            await self._watch(out, reader, client_id, heard)
        finally:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, *_FAULTS):
                    await reader
            out.close()

    async def _watch(
        self, out: asyncio.StreamWriter, reader: asyncio.Task[None], client_id: int, heard: list[float]
    ) -> None:
        """Turn tracking on (again after each loss of the view) while the subscriber lives."""
        loop = asyncio.get_running_loop()
        while True:
            self._lost.clear()
            overflows = self._view.overflows
            await self._enable(client_id)
            while not self._lost.is_set():
                lost = asyncio.ensure_future(self._lost.wait())
                await asyncio.wait({reader, lost}, timeout=self._ping_s, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                if reader.done():
                    reader.result()  # its fault
                    raise ConnectionError("the invalidation connection closed")
                silent = loop.time() - heard[0]
                if silent > 2 * self._lease_s:
                    raise TimeoutError(f"the invalidation connection was silent for {silent:.0f} s")
                if silent >= self._ping_s:
                    out.write(_PING)
            # Over the bound with Redis itself holding more than half of it, a scan again soon
            # would find as many keys. Otherwise the view filled up with keys changed since
            # (deleted and expired ones among them, dropped only when looked up): a scan
            # again starts it afresh.
            full = self._view.overflows > overflows and 2 * self._scanned > self._view.max_keys
            await asyncio.sleep(self._overflow_retry_s if full else self._retry_s)

    async def _read(self, sub: asyncio.StreamReader, heard: list[float]) -> None:
        view, loop = self._view, asyncio.get_running_loop()
        while True:
            message = await _reply(sub)
            heard[0] = loop.time()
            view.renew(view.clock() + self._lease_s)
            if isinstance(message, list) and len(message) == 3 and message[0] == b"message":
                keys = message[2]
                view.invalidate(None if keys is None else [key.decode() for key in keys])

    async def _enable(self, client_id: int) -> None:
        """Tracking on for the cache's connection (off first: a second ``ON`` with the same
        prefix is refused), then the scan; the view answers once both are done."""
        view, fast = self._view, self._fast
        generation = view.begin()
        redirect = b"%d" % client_id
        off = fast.command(b"CLIENT", b"TRACKING", b"OFF")
        prefix = PREFIX.encode()
        on = fast.command(
            b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", redirect, b"BCAST", b"PREFIX", prefix, b"NOLOOP"
        )
        try:
            await off
            await on
        except ResponseError:
            raise
        except REDIS_FAULTS as exc:
            _log.info("cache_view_tracking_failed", error=type(exc).__name__, detail=str(exc)[:200])
            view.reset()
            return
        cursor: int = 0
        self._scanned = 0
        while True:
            try:
                cursor, keys = await self._redis.scan(cursor, match=f"{PREFIX}*", count=_SCAN_COUNT)
            except ResponseError:
                raise
            except REDIS_FAULTS:
                view.reset()
                return
            self._scanned += len(keys)
            if not view.fill(generation, [k.decode() if isinstance(k, bytes) else str(k) for k in keys]):
                return
            if not cursor:
                break
        if view.finish(generation):
            _log.info("cache_view_ready", keys=len(view))


async def _reply(reader: asyncio.StreamReader) -> Any:
    """One RESP2 reply: an error raises :class:`ResponseError`; a null is None."""
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"*":
        count = int(rest)
        return None if count < 0 else [await _reply(reader) for _ in range(count)]
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else (await reader.readexactly(size + 2))[:-2]
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise ResponseError(rest.decode(errors="replace"))
    return rest
