"""The response cache's local view (gateway/cache/view.py, kept by gateway/cache/tracking.py)
against a real redis-server of this test's own: two caches sharing it stand for two gateways
of a fleet. A key the view knows absent is a miss without a ``GET``, an entry it holds is a
hit without one; every change another client makes reaches the view, and every fault makes
the view step aside (lookups ask Redis) until tracking is on again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import redis

from gateway.cache.entry import Entry
from gateway.cache.key import PREFIX, CachePlan
from gateway.cache.service import ResponseCache
from gateway.cache.view import ASK, LocalView
from gateway.store import connect
from gateway.store.embedded import EmbeddedRedis
from gateway.store.gate import RedisGate
from gateway.store.resp import fast_client

KEY = f"{PREFIX}team:3f2a"


@pytest.fixture()
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(supervise=False) as embedded:
        yield embedded


class Gateway:
    """One gateway's response cache, tracking as the app sets it up."""

    def __init__(self, url: str, view: LocalView) -> None:
        self.gate = RedisGate(2.0)
        self.redis = connect(url)
        self.cache = ResponseCache(self.redis, self.gate, fast_client(url, self.gate), view)
        self.view = view
        self.task = asyncio.ensure_future(self.cache.track())
        tracker = self.cache.tracker
        assert tracker is not None
        self.tracker = tracker
        tracker.want()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.cache.drain()
        self.cache.close()
        await self.redis.aclose()


def plan(key: str = KEY) -> CachePlan:
    return CachePlan(
        kind="chat",
        canonical=b"",
        read=True,
        write=True,
        namespace="team",
        key=key,
        ttl_s=60,
        max_bytes=1 << 20,
    )


def entry(text: str = "stored answer") -> Entry:
    body = b'{"choices":[{"message":{"content":"%s"},"finish_reason":"stop"}]}' % text.encode()
    return Entry("chat", body, {"total_tokens": 3}, "fast", time.time())


def gets(url: str) -> int:
    """How many GETs Redis has answered, since start."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.002)


Pair = Callable[[], AbstractAsyncContextManager[tuple[Gateway, Gateway]]]


@pytest.fixture()
def two(server: EmbeddedRedis) -> Pair:
    @asynccontextmanager
    async def make() -> AsyncIterator[tuple[Gateway, Gateway]]:
        a, b = Gateway(server.url, LocalView()), Gateway(server.url, LocalView())
        try:
            await until(lambda: a.view.complete and b.view.complete, "tracking never came up")
            yield a, b
        finally:
            await a.close()
            await b.close()

    return make


def test_a_key_stored_by_another_gateway_is_a_hit_here_after_its_invalidation(
    server: EmbeddedRedis, two: Pair
) -> None:
    async def run() -> None:
        async with two() as (a, b):
            before = gets(server.url)
            assert await b.cache.lookup(plan()) is None  # absent in B's view: no GET
            assert gets(server.url) == before
            assert a.cache.store(plan(), entry())
            await until(lambda: KEY in b.view._known, "B never heard of A's store")
            got = await b.cache.lookup(plan())
            assert got is not None and got.body == entry().body
            assert gets(server.url) == before + 1  # B read it once ...
            again = await b.cache.lookup(plan())
            assert again is not None and again.body == entry().body
            assert gets(server.url) == before + 1  # ... and holds it since

    asyncio.run(run())


async def stored_by_a_known_to_b(a: Gateway, b: Gateway) -> None:
    """A stores the entry (written to Redis), and B's view has heard of it."""
    a.cache.store(plan(), entry())
    await a.cache.drain()
    await until(lambda: KEY in b.view._known, "B never heard of A's store")


def test_flushall_empties_every_view(server: EmbeddedRedis, two: Pair) -> None:
    async def run() -> None:
        async with two() as (a, b):
            await stored_by_a_known_to_b(a, b)
            assert await b.cache.lookup(plan()) is not None
            redis.Redis.from_url(server.url).flushall()
            await until(
                lambda: not a.view.complete and not b.view.complete, "FLUSHALL did not reach the views"
            )
            assert await a.cache.lookup(plan()) is None
            assert await b.cache.lookup(plan()) is None
            await until(lambda: a.view.complete and b.view.complete, "the views did not scan again")
            assert len(a.view) == 0 and len(b.view) == 0

    asyncio.run(run())


def test_a_flush_of_another_database_keeps_this_ones_entries(server: EmbeddedRedis, two: Pair) -> None:
    # Redis's null invalidation does not say which database was flushed: a view that took it
    # for its own would call every entry of its database gone (each lookup a miss).
    async def run() -> None:
        async with two() as (a, b):
            await stored_by_a_known_to_b(a, b)
            other = redis.Redis.from_url(server.url, db=5)
            assert other.connection_pool.connection_kwargs["db"] == 5
            other.set("unrelated", b"x")
            other.flushdb()
            await until(lambda: not b.view.complete, "the FLUSHDB did not reach B's view")
            got = await b.cache.lookup(plan())
            assert got is not None and got.body == entry().body
            await until(lambda: b.view.complete, "B's view did not scan again")
            got = await b.cache.lookup(plan())
            assert got is not None and got.body == entry().body

    asyncio.run(run())


def test_a_killed_tracking_connection_sends_lookups_to_redis_until_tracking_is_back(
    server: EmbeddedRedis, two: Pair
) -> None:
    async def run() -> None:
        async with two() as (_a, b):
            b.tracker._retry_s = 0.2
            assert await b.cache.lookup(plan()) is None
            client_id = b.tracker.client_id
            assert client_id is not None
            admin = redis.Redis.from_url(server.url)
            admin.client_kill_filter(_id=client_id)
            await until(lambda: not b.view.complete, "B's view did not notice its subscriber killed")
            # Another client's store, while B hears nothing: B must ask Redis, and finds it.
            admin.set(KEY, entry().encode(), px=60_000)
            before = gets(server.url)
            got = await b.cache.lookup(plan())
            assert got is not None and got.body == entry().body
            assert gets(server.url) == before + 1
            await until(lambda: b.view.complete, "tracking did not come back")
            assert b.tracker.sessions == 2
            admin.delete(KEY)
            await until(lambda: KEY in b.view._known, "the new subscriber hears nothing")

    asyncio.run(run())


def test_a_view_over_its_bound_steps_aside_and_lookups_ask_redis(server: EmbeddedRedis, two: Pair) -> None:
    admin = redis.Redis.from_url(server.url)
    for i in range(5):
        admin.set(f"{PREFIX}team:old{i}", entry().encode(), px=60_000)

    async def run() -> None:
        a = Gateway(server.url, LocalView(max_keys=4))
        try:
            await until(lambda: a.view.overflows > 0, "the scan did not find the keys over the bound")
            assert not a.view.complete
            before = gets(server.url)
            got = await a.cache.lookup(plan(f"{PREFIX}team:old3"))
            assert got is not None and gets(server.url) == before + 1
            assert await a.cache.lookup(plan()) is None
            assert gets(server.url) == before + 2
        finally:
            await a.close()

    asyncio.run(run())


def test_an_invalidation_overtaking_a_get_reply_keeps_the_reply_out_of_the_view() -> None:
    """The classic race, ordered by hand: a key's GET is in flight, another client changes
    the key, its invalidation arrives before the GET's (older) reply."""
    view = LocalView()
    view.renew(float("inf"))
    generation = view.begin()
    view.fill(generation, [KEY])
    assert view.finish(generation)
    token = view.fetching(KEY)
    view.invalidate([KEY])
    view.fetched(KEY, token, entry("old"), 60_000)
    assert view.find(KEY) is ASK  # ask Redis again
    # Without the race, the reply is kept.
    token = view.fetching(KEY)
    view.fetched(KEY, token, entry("new"), 60_000)
    held = view.find(KEY)
    assert isinstance(held, Entry) and b"new" in held.body


def read(view: LocalView, key: str, pttl_ms: int) -> None:
    """A GET of ``key`` (and its PTTL) as the cache makes it, answered with an entry."""
    view.fetched(key, view.fetching(key), entry(), pttl_ms)


def test_a_held_entry_is_not_served_past_its_deadline_and_the_bytes_are_bounded() -> None:
    now = [100.0]
    size = len(entry().body)
    view = LocalView(max_bytes=size + size // 2, clock=lambda: now[0])
    view.renew(float("inf"))
    view.finish(view.begin())
    view.stored(KEY)  # this process's own store: known, its entry held once read back
    assert view.find(KEY) is ASK
    read(view, KEY, 10_000)
    assert isinstance(view.find(KEY), Entry)
    other = f"{PREFIX}team:other"
    read(view, other, 10_000)  # over the bound: the least recently used goes
    assert view.find(KEY) is ASK
    assert isinstance(view.find(other), Entry) and view.held_bytes == size
    now[0] += 10.0
    assert view.find(other) is ASK


def test_the_view_steps_aside_when_redis_has_not_been_heard_from_for_its_lease() -> None:
    """A frozen Redis, or a network cut, sends no invalidations: the view stops answering."""
    now = [100.0]
    view = LocalView(clock=lambda: now[0])
    view.finish(view.begin())
    view.renew(101.5)
    read(view, KEY, 60_000)
    assert isinstance(view.find(KEY), Entry) and view.find(f"{PREFIX}team:other") is None
    now[0] = 101.5
    assert view.find(KEY) is ASK and view.find(f"{PREFIX}team:other") is ASK and not view.complete
    view.renew(103.0)  # a PONG (or any message) came
    assert isinstance(view.find(KEY), Entry)


def test_a_view_filled_up_by_changes_starts_afresh_with_a_new_scan(server: EmbeddedRedis) -> None:
    """Keys another client stores and deletes stay in the view (as "ask Redis") until looked
    up; when they fill it, it scans again at once (Redis holds few keys), not a minute later."""
    admin = redis.Redis.from_url(server.url)
    admin.set(f"{PREFIX}team:live", entry().encode(), px=60_000)

    async def run() -> None:
        a = Gateway(server.url, LocalView(max_keys=4))
        try:
            a.tracker._retry_s = 0.05
            await until(lambda: a.view.complete, "tracking never came up")
            for i in range(4):
                admin.set(f"{PREFIX}team:gone{i}", b"x", px=60_000)
                admin.delete(f"{PREFIX}team:gone{i}")
            await until(lambda: a.view.overflows == 1, "the changes did not fill the view")
            await until(lambda: a.view.complete, "no scan again")
            assert len(a.view) == 1
        finally:
            await a.close()

    asyncio.run(run())


def test_a_redis_refusing_tracking_leaves_the_view_off_and_is_not_counted_as_failing(
    server: EmbeddedRedis,
) -> None:
    """A Redis user without CLIENT TRACKING (an ACL): no view, one warning, and Redis is not taken for
    unreachable (that would send every request upstream and open the rate limits)."""
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-client|tracking")
    admin.set(KEY, entry().encode(), px=60_000)
    url = server.url.replace("unix://", "unix://limited:pw@")

    async def run() -> None:
        a = Gateway(url, LocalView())
        try:
            await until(lambda: a.task.done(), "the tracker did not give up")
            assert a.task.exception() is None and not a.view.complete
            got = await a.cache.lookup(plan())  # asked of Redis, as without a view
            assert got is not None and got.body == entry().body
            assert a.gate.failed_calls == 0 and not a.gate.unreachable
        finally:
            await a.close()

    asyncio.run(run())
