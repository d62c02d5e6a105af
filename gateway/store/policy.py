"""One policy for a fleet: ``switchyard policy push`` writes a policy to Redis, and every
gateway started with ``SWITCHYARD_POLICY_FROM_REDIS=1`` serves it.

The pushed policy is one hash (``sy:policy``: the YAML bytes, their digest, where they came
from and when), so a push is one atomic ``HSET`` on a single Redis and on a Redis Cluster.
A following gateway reads only the digest every ``reload_interval_s`` and the text only
when the digest changed, so every gateway of a fleet swaps to a pushed policy within one
reload interval of the push (plus one Redis round trip). Before it serves its first
request a following gateway adopts what is pushed already; when nothing is pushed yet it
serves its ``--policy`` file (or the embedded one) until a push arrives. A pushed policy
that fails validation on a gateway (an ``${ENV}`` it lacks, say) keeps the previous one
serving there, with the reason in ``/readyz``, as a bad file edit does.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from redis.asyncio import Redis

from gateway.config import PolicyHolder, policy_digest
from gateway.store.gate import REDIS_FAULTS

_log = structlog.get_logger("switchyard.config")

POLICY_KEY = "sy:policy"
_READ_BOUND_S = 1.0


async def push_policy(redis: Redis, text: bytes, source: str) -> str:
    """Store ``text`` as the fleet's policy; returns its digest. Validate it first."""
    digest = policy_digest(text)
    mapping: dict[str, bytes | str] = {
        "text": text,
        "digest": digest,
        "source": source,
        "pushed_at": repr(time.time()),
    }
    await redis.hset(POLICY_KEY, mapping=mapping)  # type: ignore[arg-type]  # dict is invariant
    return digest


async def pushed_digest(redis: Redis) -> str | None:
    """The digest of the policy pushed to Redis, or None when none is."""
    value = await redis.hget(POLICY_KEY, "digest")
    return None if value is None else value.decode() if isinstance(value, bytes) else str(value)


async def follow_once(redis: Redis, holder: PolicyHolder) -> bool:
    """Adopt the pushed policy when it differs from the one served; True when swapped."""
    async with asyncio.timeout(_READ_BOUND_S):
        digest = await pushed_digest(redis)
        if digest is None or digest == holder.current.digest:
            return False
        fields = await redis.hmget(POLICY_KEY, ["text", "source"])
    text, source = fields
    if not isinstance(text, bytes):
        return False
    where = f"redis:{POLICY_KEY}" + (f" ({source.decode()})" if isinstance(source, bytes) else "")
    return holder.adopt(text, where)


async def follow(redis: Redis, holder: PolicyHolder, interval_s: float) -> None:
    """Poll the pushed policy's digest every ``interval_s`` until cancelled."""
    failures = 0
    while True:
        await asyncio.sleep(interval_s)
        try:
            await follow_once(redis, holder)
        except REDIS_FAULTS as exc:
            failures += 1
            # One line when it starts failing and one every 100 tries: the policy in
            # service keeps serving meanwhile.
            if failures == 1 or failures % 100 == 0:
                _log.warning("policy_follow_failed", error=type(exc).__name__, failures=failures)
            continue
        failures = 0
