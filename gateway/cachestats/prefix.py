"""The gateway's expectation of a provider's prefix-cache hit.

A prompt's checkpoint chain (:mod:`gateway.cachestats.chain`) is matched against the
chains seen before: the expected cached tokens are the leading checkpoints already seen
for the deployment within the cache TTL:

- in this process (:class:`LocalPrefixes`), at once, for the ``x-switchyard-prefix-hit``
  header: this replica's view;
- in Redis (:func:`expect_shared`), off the request path and batched (one round trip
  for all the requests of a flush interval), for the statistics: the view of every
  replica together.

A vLLM deployment counts in its own units (:class:`Geometries`): its KV cache block
size (16 on GPUs, 128 on vLLM's CPU backend; from the policy, the launch's preflight or
its ``/metrics``) and its tokenizer's bytes per token, calibrated from the
``prompt_tokens`` it reports against the rendered prompt's length. For those deployments
the matched bytes are converted to tokens and rounded down to whole blocks, as vLLM
counts ``cached_tokens``.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from redis.asyncio import Redis

from gateway.cachestats.chain import (
    CHECKPOINT_BYTES,
    CHECKPOINT_TOKENS,
    FINE_BYTES,
    U32,
    VLLM_BLOCK_TOKENS,
    PrefixChain,
)
from gateway.store import eval_each

KEY_PREFIX = "sy:pfx:"
_FINE_KEY_PREFIX = "sy:pfx64:"


class Geometries:
    """How each vLLM deployment counts cached tokens: block size and bytes per token.

    Deployments not named here are counted like OpenAI (128-token steps of 512 bytes).
    The bytes-per-token ratio (of every deployment) starts at 4 and follows the
    ``prompt_tokens`` the deployment reports (an exponential average over requests), off
    the request path.
    """

    RATIO_WEIGHT = 0.2

    def __init__(self) -> None:
        self._block_tokens: dict[str, int] = {}
        self._bytes_per_token: dict[str, float] = {}
        self._tokenizer_ratio: dict[str, float] = {}

    def use_vllm(self, deployment: str, block_tokens: int | None = None) -> None:
        """Count ``deployment`` as vLLM does; ``block_tokens`` when known (policy, discovered)."""
        if block_tokens is not None and block_tokens > 0:
            self._block_tokens[deployment] = block_tokens
        else:
            self._block_tokens.setdefault(deployment, VLLM_BLOCK_TOKENS)

    def is_vllm(self, deployment: str) -> bool:
        """Whether ``deployment`` is counted in vLLM's blocks."""
        return deployment in self._block_tokens

    def block_tokens(self, deployment: str) -> int:
        """The deployment's cache block (or checkpoint) size in tokens."""
        return self._block_tokens.get(deployment, CHECKPOINT_TOKENS)

    def bytes_per_token(self, deployment: str) -> float:
        """Prompt bytes per token of the deployment's tokenizer: as the model's own tokenizer
        measured them where Switchyard reads it (:mod:`gateway.shaping.tokens`), else
        calibrated from its replies; 4 until either is known."""
        found = self._tokenizer_ratio.get(deployment)
        if found is not None:
            return found
        return self._bytes_per_token.get(deployment, CHECKPOINT_BYTES / CHECKPOINT_TOKENS)

    def use_tokenizer_ratio(self, deployment: str, bytes_per_token: float) -> None:
        """The deployment's bytes per token as its model's tokenizer counted its prompts."""
        if bytes_per_token > 0:
            self._tokenizer_ratio[deployment] = bytes_per_token

    def observe(self, deployment: str, chain: Sequence[int] | None, prompt_tokens: int | None) -> None:
        """Calibrate bytes per token from a finished request's rendered prompt and usage."""
        if not isinstance(chain, PrefixChain) or not prompt_tokens:
            return  # every deployment: an estimate in its own tokens never exceeds its prompt
        if chain.prompt_bytes < 256:  # too short: the chat template's own tokens dominate
            return
        sample = chain.prompt_bytes / prompt_tokens
        before = self._bytes_per_token.get(deployment)
        self._bytes_per_token[deployment] = (
            sample if before is None else before + self.RATIO_WEIGHT * (sample - before)
        )

    def lookup_chain(self, deployment: str, chain: Sequence[int]) -> tuple[Sequence[int], int]:
        """The chain to look ``deployment`` up with, and its step in bytes."""
        if isinstance(chain, PrefixChain) and deployment in self._block_tokens:
            return chain.fine, FINE_BYTES
        return chain, CHECKPOINT_BYTES

    def tokens(self, deployment: str, matched_steps: int, step_bytes: int, prompt_bytes: int = 0) -> int:
        """Expected cached tokens for ``matched_steps`` leading steps of ``step_bytes``, in the
        deployment's tokens (bytes per token calibrated by its replies; 4 until then) and
        whole blocks (128-token steps for a deployment counted like OpenAI); never more than
        the prompt's own estimate (``prompt_bytes``, when known)."""
        block = self.block_tokens(deployment)
        ratio = self.bytes_per_token(deployment)
        matched = matched_steps * step_bytes
        if prompt_bytes:
            matched = min(matched, prompt_bytes)
        return int(matched / ratio // block) * block

    def estimate(self, deployment: str, prompt_bytes: int) -> int:
        """A byte count in the deployment's tokens (calibrated, as :meth:`tokens`)."""
        return int(prompt_bytes / self.bytes_per_token(deployment))


GEOMETRY = Geometries()
"""This process's view of its vLLM deployments (learned from policies, launches, replies)."""


class LocalPrefixes:
    """Checkpoints seen per deployment in this process, expiring after ``ttl_s`` (bounded LRU)."""

    def __init__(self, capacity: int = 200_000, geometry: Geometries | None = None) -> None:
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._capacity = capacity
        self.geometry = GEOMETRY if geometry is None else geometry

    def expect_and_add(self, deployment: str, chain: Sequence[int], ttl_s: float) -> int:
        """Expected cached tokens for this chain; then remember it."""
        size = chain.prompt_bytes if isinstance(chain, PrefixChain) else 0
        chain, step = self.geometry.lookup_chain(deployment, chain)
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
        return self.geometry.tokens(deployment, hits, step, size)


_EXPECT_LUA = """
-- KEYS[1], KEYS[2]: the prefixes of one deployment's checkpoint keys, coarse and fine (one
-- hash tag: one slot). ARGV, per chain: its TTL in ms, 0 (coarse) or 1 (fine), and its
-- checkpoints as little-endian uint32s. Returns per chain how many leading checkpoints
-- were there (in Redis before this call, or in a chain before it); then sets every key to
-- expire after the longest TTL that asked for it.
local chains, order, ttl = {}, {}, {}
for a = 1, #ARGV, 3 do
  local ms, prefix, blob, keys = tonumber(ARGV[a]), KEYS[tonumber(ARGV[a + 1]) + 1], ARGV[a + 2], {}
  for p = 1, #blob, 4 do
    local key = prefix .. string.format('%08x', (struct.unpack('<I4', blob, p)))
    keys[#keys + 1] = key
    local had = ttl[key]
    if not had then order[#order + 1] = key end
    if not had or had < ms then ttl[key] = ms end
  end
  chains[#chains + 1] = keys
end
local found, seen, out = {}, {}, {}
for i = 1, #order, 1000 do  -- unpack() of many keys would overflow Lua's stack
  local got = redis.call('MGET', unpack(order, i, math.min(i + 999, #order)))
  for j = 1, #got do found[order[i + j - 1]] = got[j] end
end
for c = 1, #chains do
  local keys, hits = chains[c], 0
  for k = 1, #keys do
    if found[keys[k]] or seen[keys[k]] then hits = hits + 1 else break end
  end
  for k = 1, #keys do seen[keys[k]] = true end
  out[c] = hits
end
for key, ms in pairs(ttl) do redis.call('SET', key, '1', 'PX', ms) end
return out
"""
"""One deployment's lookups and writes of a batch in one call, its chains sent as bytes:
no Python work per checkpoint, one reply for redis-py to parse. As a pipeline of an MGET
per chain and a SET per checkpoint, a batch of 20 requests with ~60 checkpoints each held
the event loop for ~20 ms (bench/probes/redis_writes.py)."""


def _packed(steps: Sequence[int]) -> bytes:
    """A chain as little-endian uint32s."""
    values = steps if isinstance(steps, array) else array(U32, steps)
    if sys.byteorder == "big":
        values = array(U32, values)
        values.byteswap()
    return values.tobytes()


async def expect_shared(
    redis: Redis, batch: list[tuple[str, Sequence[int], float]], geometry: Geometries | None = None
) -> list[int]:
    """Expected cached tokens for each ``(deployment, chain, ttl_s)``, from the checkpoints any
    replica recorded, in one round trip; records the chains. Within the batch, a chain also
    sees the ones before it (as if they had been looked up one after the other); identical
    chains (a busy template) are looked up once. One script call per deployment
    (:data:`_EXPECT_LUA`; a deployment's keys share a hash tag, so this holds on a Redis
    Cluster too)."""
    geometry = GEOMETRY if geometry is None else geometry
    args: dict[str, list[int | bytes]] = {}
    looked_up: dict[tuple[str, bytes], int] = {}
    # Per request: its deployment, its step, and its chain's place in the deployment's
    # script call (-1: the same chain earlier in the batch, so every checkpoint is there).
    places: list[tuple[str, int, int, int]] = []
    for deployment, chain, ttl_s in batch:
        steps, step = geometry.lookup_chain(deployment, chain)
        packed = _packed(steps)
        place = looked_up.get((deployment, packed))
        if place is not None:
            places.append((deployment, step, -1, len(steps)))
            continue
        calls = args.setdefault(deployment, [])
        looked_up[deployment, packed] = place = len(calls) // 3
        calls += (max(1, int(ttl_s * 1000)), int(step != CHECKPOINT_BYTES), packed)
        places.append((deployment, step, place, len(steps)))
    # One hash tag per deployment: on Redis Cluster all of its keys share a slot.
    per_deployment = [((f"{KEY_PREFIX}{{{d}}}:", f"{_FINE_KEY_PREFIX}{{{d}}}:"), a) for d, a in args.items()]
    hits_of = dict(zip(args, await eval_each(redis, _EXPECT_LUA, per_deployment), strict=True))
    sizes = [chain.prompt_bytes if isinstance(chain, PrefixChain) else 0 for _, chain, _ in batch]
    return [
        geometry.tokens(deployment, length if place < 0 else int(hits_of[deployment][place]), step, size)
        for (deployment, step, place, length), size in zip(places, sizes, strict=True)
    ]
