"""The gateway's expectation of cached tokens, looked up in a real Redis in batches."""

from __future__ import annotations

import asyncio

import redis

from gateway.cachestats.prefix import CHECKPOINT_TOKENS, expect_shared
from gateway.store import connect


def test_a_batch_sees_itself_in_order_and_the_next_batch_sees_it_all(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()

    async def run() -> tuple[list[int], list[int], list[int]]:
        client = connect(redis_url)
        try:
            first = await expect_shared(
                client, [("d", [1, 2, 3], 60.0), ("d", [1, 2, 3], 60.0), ("d", [1, 2], 60.0)]
            )
            second = await expect_shared(client, [("d", [1, 2, 3, 4], 60.0), ("other", [1, 2, 3], 60.0)])
            gone = await expect_shared(client, [("d", [9], 0.001)])
            await asyncio.sleep(0.05)
            return first, second, gone + await expect_shared(client, [("d", [9], 60.0)])
        finally:
            await client.aclose()

    first, second, expired = asyncio.run(run())
    assert first == [0, 3 * CHECKPOINT_TOKENS, 2 * CHECKPOINT_TOKENS]
    assert second == [3 * CHECKPOINT_TOKENS, 0]  # a deployment's cache is its own
    assert expired == [0, 0]  # a prefix older than the cache TTL is not expected
