"""The response cache on the request path: a bounded lookup before dispatch, a store after
the answer, off the client's path.

Every Redis call goes through the request path's :class:`~gateway.store.gate.RedisGate`:
a slow or stopped Redis costs a lookup at most the gate's bound (then none, while the
gate counts Redis unreachable) and the request goes upstream as if the cache were off.
Bytes under a key that are not an entry are a miss, and are deleted.

Entries are read and written with :class:`~gateway.store.resp.RespClient` (one pipelined
connection, bounded by the same gate) where the Redis URL allows it, so that a miss costs
the request a few microseconds of CPU, not redis-py's hundreds; with a TLS or Redis
Cluster URL, and for the semantic cache's vectors, through redis-py. With that client,
a :class:`~gateway.cache.view.LocalView` kept right by Redis's invalidations
(:mod:`gateway.cache.tracking`) answers most lookups without asking Redis at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, cast

import orjson
import structlog
from redis.asyncio import Redis

from gateway.cache.entry import CorruptEntry, Entry, decode
from gateway.cache.key import CachePlan
from gateway.cache.policy import CachePolicy
from gateway.cache.replay import assemble_chat, chat_chunks, responses_events
from gateway.cache.semantic import SemanticIndex
from gateway.cache.tracking import Tracker
from gateway.cache.view import ASK, LocalView
from gateway.context import RequestContext
from gateway.dialects.responses.native import NativeResponsesScanner
from gateway.dispatch.attempt import OpenStream, UnaryResult
from gateway.providers.base import Scanner
from gateway.store.gate import REDIS_FAULTS, RedisGate
from gateway.store.resp import RespClient

_log = structlog.get_logger("switchyard.cache")

HEADER = "x-switchyard-cache"
ENTRY_HEADER = "x-switchyard-cache-entry"
"""The id of the entry that answered (``switchyard cache inspect`` shows it)."""


class AnswerStream(Protocol):
    """What the SSE writer reads of a stream: an upstream's, or a replayed entry."""

    @property
    def first(self) -> bytes: ...

    @property
    def scanner(self) -> Scanner: ...

    def rest(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...


class ResponseCache:
    """Lookups and stores of one gateway process, over the Redis its replicas share."""

    def __init__(
        self, redis: Redis, gate: RedisGate, fast: RespClient | None = None, view: LocalView | None = None
    ) -> None:
        self._redis = redis
        self._gate = gate
        self._fast = fast
        self._tasks: set[asyncio.Task[None]] = set()
        self._semantic: SemanticIndex | None = None
        self.view = view if fast is not None else None
        """The local view of the entries' keys (None: every lookup asks Redis)."""
        self.tracker = Tracker(redis, fast, view) if fast is not None and view is not None else None

    async def track(self) -> None:
        """Keep the local view right, until cancelled (nothing to do without one)."""
        if self.tracker is not None:
            await self.tracker.run()

    @property
    def semantic(self) -> SemanticIndex:
        """The semantic cache's index (made when a policy first uses it)."""
        if self._semantic is None:
            self._semantic = SemanticIndex(self._redis, self._gate)
        return self._semantic

    async def lookup(self, plan: CachePlan) -> Entry | None:
        """The entry under ``plan``'s key; None when missing, corrupt, or Redis cannot answer."""
        gate = self._gate
        if gate.unreachable:
            gate.skip()
            plan.write = False  # Redis is failing: this request runs as if the cache were off
            return None
        view = self.view
        if view is not None:
            found = view.find(plan.key)
            if found is not ASK:
                return cast(Entry | None, found)  # held here, or not in Redis: no round trip
            if not view.complete:
                cast(Tracker, self.tracker).want()
        return await self._read(plan, plan.key)

    async def nearest(self, plan: CachePlan, threshold: float) -> tuple[Entry, float, str] | None:
        """The semantic cache's answer: the entry of the nearest stored turn of the plan's
        group, its similarity and its key, when the similarity is at least ``threshold``."""
        found = await self.semantic.nearest(plan)
        if found is None or found[1] < threshold:
            return None
        key, similarity = found
        entry = await self._read(plan, key)
        if entry is None:
            self._spawn(self.semantic.forget(plan, key))
            return None
        return entry, similarity, key

    async def _read(self, plan: CachePlan, key: str) -> Entry | None:
        fast, view = self._fast, self.view
        if view is not None and view.complete:
            return await self._fetch(plan, key, view)
        data: bytes | str | None
        try:
            if fast is not None:
                data = await fast.get(key)
            else:
                data = await self._gate.call(lambda: self._redis.get(key))
        except REDIS_FAULTS:
            plan.write = False
            return None
        return self._decode(plan, key, data)

    async def _fetch(self, plan: CachePlan, key: str, view: LocalView) -> Entry | None:
        """A ``GET`` (with its ``PTTL``) of a key the view knows exists, its entry kept."""
        fast = cast(RespClient, self._fast)
        token = view.fetching(key)
        got, left = fast.get_pttl(key)
        try:
            data = await got
            pttl = await left
        except REDIS_FAULTS:
            if left.done():
                left.exception()  # the same fault: retrieved, not logged as lost
            view.abandon(key)
            plan.write = False
            return None
        entry = self._decode(plan, key, data)
        if entry is not None or data is None:
            view.fetched(key, token, entry, pttl)
        else:
            view.abandon(key)
        return entry

    def _decode(self, plan: CachePlan, key: str, data: bytes | str | None) -> Entry | None:
        """The entry in ``data``; None when there is none, and deleted when corrupt."""
        if not isinstance(data, bytes):
            return None
        try:
            return decode(data, plan.kind)
        except (CorruptEntry, ValueError, TypeError):
            _log.warning("cache_entry_corrupt", key=key)
            if self._fast is not None:
                self._fast.delete(key)
                if self.view is not None:
                    self.view.deleted(key)
            else:
                self._spawn(self._write(key, None, 0))
            return None

    def store(self, plan: CachePlan, entry: Entry, then: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Keep ``entry`` under ``plan``'s key (written off the client's path); False when it
        is over the namespace's size bound or Redis is counted unreachable. ``then`` runs
        once the entry is written (the semantic cache's vector: never before its entry, or a
        lookup in between would find the vector without its entry and drop it)."""
        if self._gate.unreachable:
            # Redis has just failed this request's lookup (or another's): storing would too.
            return False
        data = entry.encode()
        if len(data) > plan.max_bytes:
            return False
        ttl_ms = max(1, int(plan.ttl_s * 1000))
        if then is None and self._fast is not None:
            self._fast.set(plan.key, data, ttl_ms)  # no task: the reply is only checked
        else:
            self._spawn(self._write(plan.key, data, ttl_ms, then))
        if self.view is not None:
            # Now, not when Redis's invalidation of a write through redis-py comes back.
            self.view.stored(plan.key)
        return True

    async def drain(self) -> None:
        """Wait for the stores in flight (at shutdown, and in tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._fast is not None:
            await self._fast.sync()

    def close(self) -> None:
        """Close the cache's own connection (after :meth:`drain`)."""
        if self._fast is not None:
            self._fast.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(
        self, key: str, data: bytes | None, ttl_ms: int, then: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        gate = self._gate
        if gate.unreachable:
            gate.skip()
            return
        try:
            if data is None:
                await gate.call(lambda: self._redis.delete(key))
            else:
                await gate.call(lambda: self._redis.set(key, data, px=ttl_ms))
        except REDIS_FAULTS:
            return
        if then is not None:
            await then()


def hit(
    ctx: RequestContext, plan: CachePlan, entry: Entry, key: str, similarity: float | None = None
) -> None:
    """Mark ``ctx`` answered from ``entry`` (stored under ``key``): its deployment and usage,
    nothing attempted; a semantic hit says how similar the stored turn was."""
    plan.outcome = "hit"
    plan.entry_id, plan.similarity = key.rpartition(":")[2], similarity
    plan.template = entry.template
    ctx.deployment = entry.deployment
    ctx.usage = entry.usage
    ctx.cache_hit = True
    headers = ctx.response_headers
    headers[HEADER] = "hit" if similarity is None else f"hit; semantic; sim={similarity:.2f}"
    headers[ENTRY_HEADER] = plan.entry_id


def storable(plan: CachePlan, ctx: RequestContext, answer: dict[str, Any], allow_length: bool) -> bool:
    """Whether ``answer`` (of ``plan``'s kind) may be kept: the planned deployment answered
    without escalation, and it is a finished, valid answer."""
    if not plan.write or not plan.key or ctx.escalated is not None or ctx.deployment != plan.deployment:
        return False
    if answer.get("error") is not None:
        return False
    if plan.kind == "responses":
        status = answer.get("status")
        return status == "completed" or (allow_length and status == "incomplete")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    finish = choices[0].get("finish_reason")
    return finish in ("stop", "tool_calls", "function_call") or (allow_length and finish == "length")


def _valid_json_answer(body: dict[str, Any], answer: dict[str, Any]) -> bool:
    """An answer asked for as JSON must be JSON (else it failed validation: never stored)."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        return True
    try:
        message = answer["choices"][0]["message"]
        orjson.loads(message.get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError, orjson.JSONDecodeError):
        return False
    return True


def keep_answer(
    cache: ResponseCache,
    plan: CachePlan,
    ctx: RequestContext,
    body: dict[str, Any],
    answer: dict[str, Any],
    raw: bytes,
    policy: CachePolicy,
    template: str | None,
) -> bool:
    """Store a finished answer when it may be kept (and its turn's vector, for the semantic
    cache); whether it was."""
    if not storable(plan, ctx, answer, policy.store_length) or not _valid_json_answer(body, answer):
        return False
    entry = Entry(plan.kind, raw, ctx.usage, plan.deployment, time.time(), ctx.key_id, template)
    then = None
    if plan.group and policy.semantic.enabled:
        semantic, most = cache.semantic, policy.semantic.max_entries

        async def then() -> None:
            await semantic.add(plan, most)

    return cache.store(plan, entry, then)


class _Done:
    """The scanner of a replayed chat stream: already at its end."""

    __slots__ = ("chunks", "usage")

    done = True
    error: dict[str, Any] | None = None
    malformed: bytes | None = None
    pending = b""

    def __init__(self, usage: dict[str, Any] | None) -> None:
        self.chunks = 1
        self.usage = usage

    def feed(self, chunk: bytes) -> bytes:
        return chunk


class ReplayStream:
    """A stored answer as a whole stream, sent at once."""

    __slots__ = ("first", "scanner")

    def __init__(self, first: bytes, scanner: Scanner) -> None:
        self.first = first
        self.scanner = scanner

    async def rest(self) -> AsyncIterator[bytes]:
        """Nothing: every event is in ``first``."""
        for _ in ():
            yield b""

    def close(self) -> None:
        """No connection to give back."""


def replay_stream(plan: CachePlan, entry: Entry, body: dict[str, Any]) -> ReplayStream:
    """``entry`` as the stream of the request's endpoint kind."""
    answer = entry.answer()
    if plan.kind == "responses":
        scanner = NativeResponsesScanner()
        return ReplayStream(scanner.feed(responses_events(answer)), scanner)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return ReplayStream(chat_chunks(answer, include_usage), _Done(entry.usage))


class RecordingStream:
    """An upstream stream passed through unchanged, its answer stored once it ended whole."""

    __slots__ = ("_body", "_cache", "_ctx", "_inner", "_parts", "_plan", "_policy", "_template")

    def __init__(
        self,
        cache: ResponseCache,
        plan: CachePlan,
        ctx: RequestContext,
        body: dict[str, Any],
        inner: OpenStream,
        policy: CachePolicy,
        template: str | None,
    ) -> None:
        self._cache, self._plan, self._ctx, self._body = cache, plan, ctx, body
        self._inner = inner
        self._policy = policy
        self._template = template
        self._parts: list[bytes] = [inner.first] if plan.kind == "chat" else []

    @property
    def first(self) -> bytes:
        """The upstream's first events."""
        return self._inner.first

    @property
    def scanner(self) -> Scanner:
        """The upstream stream's scanner."""
        return self._inner.scanner

    async def rest(self) -> AsyncIterator[bytes]:
        """The rest of the upstream stream, kept (chat) for the entry."""
        keep = self._plan.kind == "chat"
        async for out in self._inner.rest():
            if keep:
                self._parts.append(out)
            yield out

    def close(self) -> None:
        """Close the upstream stream; store its answer if it ended whole. The plan's outcome
        (the stats') becomes ``miss`` when it was not stored (the header said ``store``)."""
        inner = self._inner
        inner.close()
        scanner = inner.scanner
        self._plan.outcome = "miss"
        if not scanner.done or scanner.error is not None or scanner.malformed is not None:
            return
        self._ctx.usage = scanner.usage
        answer: dict[str, Any] | None
        if self._plan.kind == "responses":
            answer = getattr(scanner, "final_response", None)
            raw = orjson.dumps(answer) if answer is not None else b""
        else:
            try:
                answer = assemble_chat(b"".join(self._parts), scanner.usage)
            except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
                answer = None
            raw = orjson.dumps(answer) if answer is not None else b""
        plan = self._plan
        if answer is not None and keep_answer(
            self._cache, plan, self._ctx, self._body, answer, raw, self._policy, self._template
        ):
            plan.outcome = "store"


def unary_hit(plan: CachePlan, entry: Entry) -> UnaryResult:
    """``entry`` as a non-stream answer: the stored bytes."""
    return UnaryResult(body=entry.body, content_type="application/json")
