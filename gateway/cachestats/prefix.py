"""The gateway's expectation of a provider's prefix-cache hit.

The shaped prompt is rendered the way the simulator (and, roughly, a chat template)
renders it, cut into checkpoints of 128 tokens (512 bytes; OpenAI counts hits in
128-token steps), and each checkpoint named by a running CRC of everything before it:
a hash chain, like vLLM's block hashes, so a checkpoint exists only if the whole prefix
up to it was sent before. The expected cached tokens are the leading checkpoints
already seen for the deployment within the cache TTL:

- in this process (:class:`LocalPrefixes`), at once, for the ``x-switchyard-prefix-hit``
  header: this replica's view;
- in Redis (:func:`expect_shared`), off the request path and batched (one round trip
  for all the requests of a flush interval), for the statistics: the view of every
  replica together.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis

from gateway.prompt_render import render_chat

CHECKPOINT_BYTES = 512
CHECKPOINT_TOKENS = 128
KEY_PREFIX = "sy:pfx:"


def checkpoints(body: Mapping[str, Any]) -> list[int]:
    """The chain of checkpoint hashes of a chat body's rendered prompt (full checkpoints only)."""
    text = render_chat(body)
    out = []
    crc = 0
    for start in range(0, len(text) - CHECKPOINT_BYTES + 1, CHECKPOINT_BYTES):
        crc = zlib.crc32(text[start : start + CHECKPOINT_BYTES], crc)
        out.append(crc)
    return out


class LocalPrefixes:
    """Checkpoints seen per deployment in this process, expiring after ``ttl_s`` (bounded LRU)."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._capacity = capacity

    def expect_and_add(self, deployment: str, chain: list[int], ttl_s: float) -> int:
        """Expected cached tokens for this chain; then remember it."""
        now = time.monotonic()
        seen = self._seen
        hits = 0
        for crc in chain:
            at = seen.get((deployment, crc))
            if at is None or now - at > ttl_s:
                break
            hits += 1
        for crc in chain:
            key = (deployment, crc)
            seen[key] = now
            seen.move_to_end(key)
        while len(seen) > self._capacity:
            seen.popitem(last=False)
        return hits * CHECKPOINT_TOKENS


async def expect_shared(redis: Redis, batch: list[tuple[str, list[int], float]]) -> list[int]:
    """Expected cached tokens for each ``(deployment, chain, ttl_s)``, from the checkpoints any
    replica recorded, in one round trip; records the chains. Within the batch, a chain also
    sees the ones before it (as if they had been looked up one after the other); identical
    chains (a busy template) are looked up once."""
    pipe = redis.pipeline(transaction=False)
    looked_up: dict[tuple[str, tuple[int, ...]], int] = {}
    keyed: list[list[str]] = []
    ttls: dict[str, int] = {}
    for deployment, chain, ttl_s in batch:
        name = (deployment, tuple(chain))
        if name in looked_up:
            continue
        looked_up[name] = len(keyed)
        # One hash tag per deployment: on Redis Cluster all of its keys share a slot (MGET works).
        keys = [f"{KEY_PREFIX}{{{deployment}}}:{crc:08x}" for crc in chain]
        keyed.append(keys)
        pipe.mget(keys)
        ms = max(1, int(ttl_s * 1000))
        for key in keys:
            ttls[key] = max(ms, ttls.get(key, 0))
    for key, ms in ttls.items():
        pipe.set(key, b"1", px=ms)
    replies = await pipe.execute()
    earlier: set[str] = set()
    out = []
    for deployment, chain, _ in batch:
        index = looked_up[deployment, tuple(chain)]
        keys = keyed[index]
        hits = 0
        for key, value in zip(keys, replies[index], strict=True):
            if value is None and key not in earlier:
                break
            hits += 1
        earlier.update(keys)
        out.append(hits * CHECKPOINT_TOKENS)
    return out
