"""The stats writer against a real Redis: a capped list keeps the newest values, newest
first, whatever the number pushed between two flushes, and expires."""

from __future__ import annotations

import asyncio
import uuid

from gateway.store import connect
from gateway.store.writer import StatsWriter


def test_a_capped_list_keeps_the_newest_values_newest_first_across_flushes(redis_url: str) -> None:
    key = f"test:capped:{uuid.uuid4().hex}"

    async def main() -> tuple[list[bytes], list[bytes], int, int]:
        client = connect(redis_url)
        writer = StatsWriter(client)
        try:
            for i in range(3):
                writer.push(key, b"a%d" % i, 5, 60)
            await writer.flush()
            first = await client.lrange(key, 0, -1)
            # More than twice the cap between two flushes: the oldest are never sent.
            for i in range(12):
                writer.push(key, b"b%d" % i, 5, 60)
            await writer.flush()
            second = await client.lrange(key, 0, -1)
            return first, second, await client.ttl(key), writer.written + writer.dropped
        finally:
            await client.delete(key)
            await client.aclose()

    first, second, ttl_s, counted = asyncio.run(main())
    assert first == [b"a2", b"a1", b"a0"]
    assert second == [b"b11", b"b10", b"b9", b"b8", b"b7"]
    assert 0 < ttl_s <= 60
    assert counted == 15  # each value counted once, as written or as dropped
