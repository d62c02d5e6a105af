"""Per-key rate limits and budgets: token buckets in Redis, checked and charged by one Lua script.

Each key with an ``rpm`` has a request bucket and each key with a ``tpm`` a token bucket,
both refilling continuously (a full minute's worth at most), kept in Redis so every
replica draws from the same buckets; the script runs atomically, reading Redis's own
clock, so two replicas never both take the last request. A request is admitted when its
request bucket holds one request, its token bucket is not empty and the key's spend is
under its budget; the tokens it used, and its cost, are charged when it ends (a stream:
when its last event has gone out), so a long answer can take the token bucket below zero
and the next request waits until it has refilled. The charge of a key with a budget is
written at once, not with the next stats batch, so a budget is overspent by no more than
the requests in flight when it ran out (tests/fleet/test_limits.py).

The three keys of a virtual key share a hash tag (``{<key id>}``), so the script runs
on a Redis Cluster too. The check is bounded by the :class:`~gateway.store.gate.RedisGate`
shared with the key check: when Redis does not answer within it (or the gate counts Redis
unreachable, then without asking), requests are admitted and counted (``errors``): a
Redis outage must not stop traffic, nor slow it down.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from redis.asyncio import Redis

from gateway.auth.keys import KeyRecord
from gateway.cachestats.cost import NANO_USD as NANO
from gateway.errors import RateLimitError
from gateway.store.gate import REDIS_FAULTS, RedisGate
from gateway.store.writer import StatsWriter

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

_log = structlog.get_logger("switchyard.limits")
_CHARGE_BOUND_S = 1.0

# KEYS: request bucket, token bucket, spend counter.
# ARGV: mode ("admit" | "charge"), rpm, tpm, budget (nano-USD), tokens, cost (nano-USD).
# admit -> {1|0, reason, request level, token level, retry after ms, spend}
LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local function level(key, limit)
  local v = redis.call('HMGET', key, 'l', 't')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil then return limit end
  return math.min(limit, l + math.max(0, now - ts) * limit / 60000)
end
if ARGV[1] == 'charge' then
  local tokens = tonumber(ARGV[5])
  if tpm > 0 and tokens > 0 then
    redis.call('HSET', KEYS[2], 'l', level(KEYS[2], tpm) - tokens, 't', now)
    redis.call('PEXPIRE', KEYS[2], 3600000)
  end
  local cost = tonumber(ARGV[6])
  if cost > 0 then redis.call('INCRBY', KEYS[3], cost) end
  return 1
end
local rl = rpm > 0 and level(KEYS[1], rpm) or 0
local tl = tpm > 0 and level(KEYS[2], tpm) or 0
local spend = tonumber(redis.call('GET', KEYS[3]) or '0')
local budget = tonumber(ARGV[4])
if budget > 0 and spend >= budget then
  return {0, 'budget', tostring(rl), tostring(tl), 0, tostring(spend)}
end
-- Both buckets may be short: the answer names the longer wait, so one retry suffices.
local wait_r = (rpm > 0 and rl < 1) and math.ceil((1 - rl) * 60000 / rpm) or 0
local wait_t = (tpm > 0 and tl <= 0) and math.ceil((1 - tl) * 60000 / tpm) or 0
if wait_r > 0 or wait_t > 0 then
  local reason = wait_t > wait_r and 'tokens' or 'requests'
  return {0, reason, tostring(rl), tostring(tl), math.max(wait_r, wait_t), tostring(spend)}
end
if rpm > 0 then
  rl = rl - 1
  redis.call('HSET', KEYS[1], 'l', rl, 't', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
return {1, 'ok', tostring(rl), tostring(tl), 0, tostring(spend)}
"""


def bucket_keys(key_id: str) -> tuple[str, str, str]:
    return (f"sy:rl:{{{key_id}}}:req", f"sy:rl:{{{key_id}}}:tok", f"sy:spend:{{{key_id}}}")


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of the check, with the ``x-ratelimit-*`` headers to answer with."""

    allowed: bool
    reason: str
    headers: dict[str, str]
    retry_after_s: float = 0.0
    spend_usd: float = 0.0


def _headers(key: KeyRecord, requests: float, tokens: float) -> dict[str, str]:
    out: dict[str, str] = {}
    if key.rpm:
        out["x-ratelimit-limit-requests"] = str(key.rpm)
        out["x-ratelimit-remaining-requests"] = str(max(0, math.floor(requests)))
        out["x-ratelimit-reset-requests"] = duration((key.rpm - requests) * 60 / key.rpm)
    if key.tpm:
        out["x-ratelimit-limit-tokens"] = str(key.tpm)
        out["x-ratelimit-remaining-tokens"] = str(max(0, math.floor(tokens)))
        out["x-ratelimit-reset-tokens"] = duration((key.tpm - tokens) * 60 / key.tpm)
    return out


class Limiter:
    """Admits requests of limited keys and charges what they used."""

    def __init__(self, redis: Redis, writer: StatsWriter, gate: RedisGate | None = None) -> None:
        self._redis = redis
        self._writer = writer
        self._script = redis.register_script(LUA)
        self._gate = gate or RedisGate()
        self.errors = 0
        self.refused: dict[str, int] = {"requests": 0, "tokens": 0, "budget": 0}
        self._last_warning = 0.0
        self._charging: set[asyncio.Task[None]] = set()
        self.charges_dropped = 0
        """Budget charges Redis did not take (a dropped stats batch counts its own)."""

    async def admit(self, key: KeyRecord) -> Admission:
        """Take one request from the key's buckets, or raise :class:`RateLimitError`."""
        if not key.limited:
            return Admission(True, "unlimited", {})
        args: list[str | int] = ["admit", key.rpm, key.tpm, round(key.budget_usd * NANO), 0, 0]
        if self._gate.unreachable:
            self._gate.skip()
            return self._fail_open("unreachable")
        try:
            reply: Any = await self._gate.call(lambda: self._script(keys=bucket_keys(key.key_id), args=args))
        except REDIS_FAULTS as exc:
            return self._fail_open(type(exc).__name__)
        allowed, reason = int(reply[0]), _text(reply[1])
        requests, tokens, retry_ms = float(reply[2]), float(reply[3]), int(reply[4])
        spend_usd = float(reply[5]) / NANO
        headers = _headers(key, requests, tokens)
        if allowed:
            return Admission(True, reason, headers, spend_usd=spend_usd)
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if reason == "budget":
            raise RateLimitError(
                f"This key has used its budget: ${spend_usd:.4f} spent of ${key.budget_usd:g}. "
                "Raise the budget or create a new key.",
                code="insufficient_quota",
                headers=headers,
            )
        retry_s = retry_ms / 1000
        unit = "requests" if reason == "requests" else "tokens"
        limit = key.rpm if reason == "requests" else key.tpm
        raise RateLimitError(
            f"Rate limit reached for key '{key.name}' on {unit} per minute: limit {limit}. "
            f"Please try again in {duration(retry_s)}.",
            retry_after_s=retry_s,
            headers=headers,
        )

    def _fail_open(self, error: str) -> Admission:
        self.errors += 1
        now = time.monotonic()
        if now - self._last_warning > 10:
            self._last_warning = now
            _log.warning("rate_limit_unavailable", errors=self.errors, error=error)
        return Admission(True, "redis_unavailable", {})

    def record(self, done: FinishedRequest) -> None:
        """Charge a finished request to its key: tokens to the TPM bucket (when the key has
        one), cost to the lifetime spend and budget."""
        key = done.key
        if key is None:
            return
        # A response cache hit asked the upstream for nothing: no tokens (and a cost of 0).
        used = key.tpm and done.cache != "hit"
        tokens = (done.prompt_tokens or 0) + (done.completion_tokens or 0) if used else 0
        self.charge(key, tokens, done.cost_nano_usd)

    def charge(self, key: KeyRecord, tokens: int, cost_nano_usd: int) -> None:
        """Charge the tokens and cost a finished request used, off the request path: with the
        next stats batch, or at once for a key with a budget."""
        if tokens <= 0 and cost_nano_usd <= 0:
            return
        keys = bucket_keys(key.key_id)
        args = ("charge", key.rpm, key.tpm, 0, max(0, tokens), max(0, cost_nano_usd))
        if key.budget_usd > 0 and cost_nano_usd > 0:
            # A budget is checked against the spend in Redis: charged with the next batch
            # (every 0.1 s), every gateway would admit a batch's worth of requests past it.
            task = asyncio.create_task(self._charge_now(keys, args))
            self._charging.add(task)
            task.add_done_callback(self._charging.discard)
            return

        def op(pipe: Any) -> None:
            pipe.eval(LUA, len(keys), *keys, *args)

        self._writer.add(op)

    async def _charge_now(self, keys: tuple[str, str, str], args: tuple[str | int, ...]) -> None:
        try:
            async with asyncio.timeout(_CHARGE_BOUND_S):
                await self._script(keys=keys, args=args)
        except REDIS_FAULTS:
            # As a dropped stats batch: counted, never retried (a retry might charge twice).
            self.charges_dropped += 1

    async def spend_usd(self, key_ids: list[str]) -> dict[str, float]:
        """Lifetime spend of each key."""
        pipe = self._redis.pipeline(transaction=False)
        for key_id in key_ids:
            pipe.get(bucket_keys(key_id)[2])
        values = await pipe.execute()
        return {k: int(v or 0) / NANO for k, v in zip(key_ids, values, strict=True)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
