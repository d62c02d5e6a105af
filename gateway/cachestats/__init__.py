"""Usage and cache-hit counters in Redis, per deployment, in 1-minute buckets kept 48 h."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from gateway.context import RequestContext
from gateway.store.writer import StatsWriter

BUCKET_S = 60
RETENTION_S = 48 * 3600
FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens")


def _key(deployment: str, minute: int) -> str:
    return f"sy:usage:{deployment}:{minute}"


def record(writer: StatsWriter, ctx: RequestContext) -> None:
    """Queue this request's counters (never waits on Redis)."""
    if ctx.deployment is None:
        return
    key = _key(ctx.deployment, int(time.time()) // BUCKET_S)
    ttl = RETENTION_S + BUCKET_S
    writer.hincr(key, "requests", 1, ttl)
    if ctx.status >= 400 or ctx.error_code:
        writer.hincr(key, "errors", 1, ttl)
    for name, value in (
        ("prompt_tokens", ctx.usage_int("prompt_tokens")),
        ("completion_tokens", ctx.usage_int("completion_tokens")),
        ("cached_tokens", ctx.cached_tokens),
    ):
        if value:
            writer.hincr(key, name, value, ttl)


async def usage(redis: Redis, deployments: list[str], since_s: int) -> dict[str, dict[str, float]]:
    """Totals per deployment over the last ``since_s`` seconds, with the cached-token share."""
    now_min = int(time.time()) // BUCKET_S
    minutes = range(now_min - max(1, since_s // BUCKET_S) + 1, now_min + 1)
    pipe = redis.pipeline(transaction=False)
    for name in deployments:
        for minute in minutes:
            pipe.hgetall(_key(name, minute))
    rows = iter(await pipe.execute())
    out: dict[str, dict[str, float]] = {}
    for name in deployments:
        totals = dict.fromkeys(FIELDS, 0.0)
        for _ in minutes:
            for field, value in next(rows).items():
                field_name = field.decode() if isinstance(field, bytes) else field
                if field_name in totals:
                    totals[field_name] += int(value)
        prompt = totals["prompt_tokens"]
        totals["cached_share"] = totals["cached_tokens"] / prompt if prompt else 0.0
        out[name] = totals
    return out
