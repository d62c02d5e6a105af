"""The in-process key cache: keys and tokens that are not keys kept apart, each bounded and
evicting the least recently used entry, never emptied whole."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.auth.keys import PREFIX, KeyStore, _hash, record_key
from gateway.errors import AuthenticationError

SALT = b"1" * 16


def _token(i: int) -> str:
    return f"{PREFIX}{i:012x}_secret{i}"


class CountingRedis:
    """Answers HGETALL from a dict of key records and counts the calls per key."""

    def __init__(self, valid: range) -> None:
        self.calls: dict[str, int] = {}
        self.records = {
            record_key(f"{i:012x}"): {"name": f"k{i}", "salt": SALT.hex(), "hash": _hash(SALT, f"secret{i}")}
            for i in valid
        }

    async def hgetall(self, key: str) -> dict[str, Any]:
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.records.get(key, {})


def test_a_full_key_cache_evicts_the_least_recently_used_key_only() -> None:
    redis = CountingRedis(range(4))
    keys = KeyStore(redis, max_cached_keys=3)  # type: ignore[arg-type]

    async def run() -> None:
        for i in range(3):
            await keys.verify(_token(i))
        await keys.verify(_token(0))  # 0 is now the most recently used; 1 the least
        await keys.verify(_token(3))  # evicts 1, nothing else
        for i in (0, 2, 3):
            await keys.verify(_token(i))

    asyncio.run(run())
    assert all(redis.calls[record_key(f"{i:012x}")] == 1 for i in (0, 2, 3)), redis.calls
    assert keys.cache_stats()["keys_cached"] == 3
    assert keys.cache_stats()["keys_evicted"] == 1


def test_bogus_tokens_are_cached_apart_and_cannot_evict_a_valid_key() -> None:
    redis = CountingRedis(range(1))
    keys = KeyStore(redis, max_cached_keys=3, max_cached_invalid=5)  # type: ignore[arg-type]

    async def run() -> None:
        await keys.verify(_token(0))
        for i in range(1000, 1100):
            with pytest.raises(AuthenticationError):
                await keys.verify(_token(i))
        assert (await keys.verify(_token(0))).name == "k0"
        # A bogus token asked again soon is answered from the negative cache.
        with pytest.raises(AuthenticationError):
            await keys.verify(_token(1099))

    asyncio.run(run())
    assert redis.calls[record_key(f"{0:012x}")] == 1
    assert redis.calls[record_key(f"{1099:012x}")] == 1
    stats = keys.cache_stats()
    assert stats["invalid_cached"] == 5 and stats["invalid_evicted"] == 95
    assert stats["keys_cached"] == 1 and stats["keys_evicted"] == 0
    assert stats["negative_hits"] == 1 and stats["hits"] == 1


def test_forget_drops_a_revoked_keys_cached_verification() -> None:
    redis = CountingRedis(range(2))
    keys = KeyStore(redis)  # type: ignore[arg-type]

    async def run() -> None:
        await keys.verify(_token(0))
        await keys.verify(_token(1))
        keys.forget(f"{0:012x}")
        await keys.verify(_token(0))
        await keys.verify(_token(1))

    asyncio.run(run())
    assert redis.calls[record_key(f"{0:012x}")] == 2
    assert redis.calls[record_key(f"{1:012x}")] == 1
