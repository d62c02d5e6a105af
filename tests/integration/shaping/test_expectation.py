"""The gateway's expectation of cached tokens, looked up in a real Redis in batches."""

from __future__ import annotations

import asyncio

import redis

from gateway.cachestats.chain import CHECKPOINT_TOKENS, FINE_BYTES, PrefixChain
from gateway.cachestats.prefix import Geometries, expect_shared
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


def test_long_chains_and_vllm_deployments_in_one_batch(redis_url: str) -> None:
    """A chain of more checkpoints than the script reads at once, and a vLLM deployment (looked
    up by its finer chain, counted in whole blocks) next to an API deployment."""
    redis.Redis.from_url(redis_url).flushdb()
    geometry = Geometries()
    geometry.use_vllm("local", block_tokens=16)
    prompt = bytes(range(256)) * 20  # 5,120 bytes: 10 coarse checkpoints, 80 fine ones
    chain = PrefixChain(prompt, 0)
    long_chain = list(range(1, 2_501))

    async def run() -> tuple[list[int], list[int]]:
        client = connect(redis_url)
        try:
            batch = [("api", long_chain, 60.0), ("local", chain, 60.0), ("api", chain, 60.0)]
            first = await expect_shared(client, batch, geometry)
            return first, await expect_shared(client, batch, geometry)
        finally:
            await client.aclose()

    first, second = asyncio.run(run())
    assert first == [0, 0, 0]
    fine_steps = len(chain.fine)
    assert second[0] == 2_500 * CHECKPOINT_TOKENS
    assert second[1] == geometry.tokens("local", fine_steps, FINE_BYTES) > 0
    assert second[2] == len(chain) * CHECKPOINT_TOKENS
    keys = redis.Redis.from_url(redis_url).keys("sy:pfx64:{local}:*")
    assert len(keys) == fine_steps  # the fine chain, under its own keys
