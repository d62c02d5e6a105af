"""The shadow sample: a share of the classifier-routed ``auto`` requests is also answered by
the other tier, off the client's path, and both answers are stored for ``route judge``.

On the client's path :meth:`ShadowSampler.after_answer` costs one random draw for a request
that is not sampled, and a sampled one only starts a task: nothing is awaited, and a shadow
call that fails is counted, never shown to the client. A shadow call is one attempt on the
other tier's first available deployment (no retries, hedges or fallbacks: its answer must
come from that tier) and never executes tools: it is a completion like any other.

Pairs are stored in Redis, in one list capped at ``max_stored`` (newest first), written
through the stats writer (batched, dropped and counted when Redis is slow): every gateway
replica and worker process shares it, where a file would be one per process. Escalations
(a fast answer that failed a check and was asked again of the strong tier) are stored in
the same list, already labelled by the check.

A stored pair (one JSON object)::

    {"v": 1, "kind": "shadow" | "escalation", "id": "<request id>", "at": <unix s>,
     "messages": [...], "tools": [...]?, "tier": "<decided tier>", "score": s | null,
     "threshold": t | null, "fast": ANSWER, "strong": ANSWER,
     "reason": "invalid_json"?, "strong_passed": true?}

where ANSWER is ``{"deployment", "content", "tool_calls", "finish_reason"}``; ``fast`` is
the answer of ``routing.fast_tier``, ``strong`` that of ``routing.strong_tier``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from gateway.cachestats.cost import NANO_USD, cost_nano_usd
from gateway.config import PolicySnapshot
from gateway.context import RequestContext
from gateway.dispatch.attempt import attempt_once
from gateway.dispatch.clock import SYSTEM_CLOCK, Clock
from gateway.errors import SwitchyardError
from gateway.providers.pool import UpstreamPool
from gateway.routing.escalation import escalation_reason
from gateway.routing.loop_policy import Shadow
from gateway.routing.resolve import Route, order_tier
from gateway.store.gate import REDIS_FAULTS
from gateway.store.writer import StatsWriter

_log = structlog.get_logger("switchyard.routing")

PAIRS_KEY = "switchyard:routing:pairs"
"""The Redis list of stored pairs, newest first."""
SPEND_KEY = "switchyard:routing:shadow_spend:"
"""+ the UTC day (``YYYYMMDD``): nano-USD spent on shadow calls that day, every gateway together."""
OUTCOMES = (
    "sampled",
    "stored",
    "failed",
    "skipped_rate",
    "skipped_busy",
    "skipped_budget",
    "skipped_unavailable",
    "skipped_key",
    "too_large",
    "escalations_stored",
)
"""What :attr:`ShadowSampler.counters` counts (the ``outcome`` label of the metric)."""


def spend_key(unix_s: float) -> str:
    """The Redis key of the shadow spend of the UTC day of ``unix_s``."""
    return SPEND_KEY + time.strftime("%Y%m%d", time.gmtime(unix_s))


def answer_of(body: bytes, deployment: str | None) -> dict[str, Any]:
    """The parts of a chat completion a judge reads (empty ones when it does not parse)."""
    try:
        obj = orjson.loads(body)
        choice = obj["choices"][0]
        message = choice.get("message") or {}
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return {"deployment": deployment, "content": None, "tool_calls": None, "finish_reason": None}
    return {
        "deployment": deployment,
        "content": message.get("content") if isinstance(message, dict) else None,
        "tool_calls": message.get("tool_calls") if isinstance(message, dict) else None,
        "finish_reason": choice.get("finish_reason"),
    }


def _prompt(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": body.get("messages")}
    if body.get("tools"):
        out["tools"] = body["tools"]
    return out


class ShadowSampler:
    """Samples, runs and stores shadow calls for one gateway process (the app builds one)."""

    def __init__(
        self,
        pool: UpstreamPool,
        available: Callable[[str], bool],
        writer: StatsWriter,
        redis: Redis,
        *,
        clock: Clock = SYSTEM_CLOCK,
        draw: Callable[[], float] = random.random,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._available = available
        self._writer = writer
        self._redis = redis
        self._clock = clock
        self._draw = draw
        self._on_outcome = on_outcome
        self._tasks: set[asyncio.Task[None]] = set()
        self._minute_started = -1e18
        self._minute_calls = 0
        self.counters: dict[str, int] = dict.fromkeys(OUTCOMES, 0)

    def _count(self, outcome: str) -> None:
        self.counters[outcome] += 1
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    @property
    def in_flight(self) -> int:
        """Shadow calls running now."""
        return len(self._tasks)

    def after_answer(self, ctx: RequestContext, route: Route, body: dict[str, Any], answer: bytes) -> None:
        """Called once a non-stream chat answer is in hand: maybe start a shadow call of the
        other tier. Only requests the classifier routed (``route.score`` set) are sampled."""
        settings = ctx.snapshot.policy.routing.shadow
        if settings is None or route.score is None or self._draw() >= settings.share:
            return
        self._count("sampled")
        routing = ctx.snapshot.policy.routing
        other = routing.strong_tier if route.tier == routing.fast_tier else routing.fast_tier
        key = ctx.key
        if key is not None and not key.allows(ctx.requested_model, other):
            # A key limited to one tier never pays for, nor reaches, the other one.
            self._count("skipped_key")
            return
        if not self._admit(settings):
            return
        task = asyncio.create_task(
            self._shadow(ctx.snapshot, ctx.request_id, ctx.deployment, route, body, answer, ctx.shape),
            name="shadow-call",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit(self, settings: Shadow) -> bool:
        if len(self._tasks) >= settings.max_concurrent:
            self._count("skipped_busy")
            return False
        now = self._clock.now()
        if now - self._minute_started >= 60.0:
            self._minute_started, self._minute_calls = now, 0
        if self._minute_calls >= settings.max_per_minute:
            self._count("skipped_rate")
            return False
        self._minute_calls += 1
        return True

    def escalated(
        self,
        ctx: RequestContext,
        route: Route,
        body: dict[str, Any],
        first: bytes,
        first_deployment: str | None,
        second: bytes,
    ) -> None:
        """Store an escalation (``route`` the fast route, ``first`` its answer, ``second`` the
        strong tier's) as a pair labelled by the check; built at the next stats flush."""
        settings = ctx.snapshot.policy.routing.shadow
        if settings is None or not settings.escalations:
            return
        policy = ctx.snapshot.policy
        request_id, reason, deployment = ctx.request_id, ctx.escalated, ctx.deployment
        at = time.time()

        def record() -> dict[str, Any]:
            # The same checks on the strong answer: a pair where both failed says little.
            passed = escalation_reason(policy, route, body, second) is None
            return {
                "v": 1,
                "kind": "escalation",
                "id": request_id,
                "at": at,
                **_prompt(body),
                "tier": route.tier,
                "score": route.score,
                "threshold": route.threshold,
                "fast": answer_of(first, first_deployment),
                "strong": answer_of(second, deployment),
                "reason": reason,
                "strong_passed": passed,
            }

        self._store(settings, record, "escalations_stored")

    def _store(self, settings: Shadow, record: Callable[[], dict[str, Any]], outcome: str) -> None:
        limit, keep, ttl = settings.max_record_bytes, settings.max_stored, max(1, int(settings.retention_s))

        def op(pipe: Any) -> None:
            # Runs in the stats writer's flush, off every request's path; a pair that cannot
            # be written must not fail the flush (and the other stats with it).
            try:
                data = orjson.dumps(record())
            except (TypeError, ValueError):
                self._count("failed")
                return
            if len(data) > limit:
                self._count("too_large")
                return
            pipe.lpush(PAIRS_KEY, data)
            pipe.ltrim(PAIRS_KEY, 0, keep - 1)
            pipe.expire(PAIRS_KEY, ttl)
            self._count(outcome)

        self._writer.add(op)

    async def _shadow(
        self,
        snapshot: PolicySnapshot,
        request_id: str,
        deployment: str | None,
        route: Route,
        body: dict[str, Any],
        answer: bytes,
        shape: Any,
    ) -> None:
        policy = snapshot.policy
        routing = policy.routing
        settings = routing.shadow
        assert settings is not None
        other = routing.strong_tier if route.tier == routing.fast_tier else routing.fast_tier
        budget_usd = settings.budget_per_day_usd
        if budget_usd is not None and not await self._within_budget(budget_usd):
            self._count("skipped_budget")
            return
        name = next((n for n in order_tier(policy, other, self._available) if self._available(n)), None)
        if name is None:
            self._count("skipped_unavailable")
            return
        ctx = RequestContext(
            request_id=f"{request_id}-shadow",
            endpoint="/v1/chat/completions",
            snapshot=snapshot,
            requested_model=str(body.get("model", "auto")),
            tier=other,
            deployment=name,
            shape=shape,
        )
        try:
            result = await attempt_once(
                ctx, self._pool, name, snapshot.timeouts(name, other), "/chat/completions", body
            )
        except (SwitchyardError, KeyError, OSError) as exc:
            self._count("failed")
            _log.debug("shadow_call_failed", request_id=request_id, deployment=name, error=repr(exc))
            return
        found = policy.deployments.get(name)
        cost = cost_nano_usd(found.price if found is not None else None, ctx.usage)
        if cost:
            key = spend_key(time.time())

            def spend(pipe: Any) -> None:
                pipe.incrby(key, cost)
                pipe.expire(key, 2 * 86400)

            self._writer.add(spend)
        client_side, shadow_side = answer_of(answer, deployment), answer_of(result.body, name)
        fast, strong = (client_side, shadow_side)
        if other == routing.fast_tier:
            fast, strong = strong, fast
        at = time.time()

        def record() -> dict[str, Any]:
            return {
                "v": 1,
                "kind": "shadow",
                "id": request_id,
                "at": at,
                **_prompt(body),
                "tier": route.tier,
                "score": route.score,
                "threshold": route.threshold,
                "fast": fast,
                "strong": strong,
            }

        self._store(settings, record, "stored")

    async def _within_budget(self, budget_usd: float) -> bool:
        """Whether today's shared shadow spend is under the budget; False when Redis does not
        answer (a spending cap fails closed)."""
        try:
            async with asyncio.timeout(0.5):
                raw = await self._redis.get(spend_key(time.time()))
        except REDIS_FAULTS:
            return False
        spent_nano = int(raw or 0)
        return spent_nano < budget_usd * NANO_USD

    async def close(self) -> None:
        """Cancel the shadow calls still running (at shutdown: they are dropped)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_pairs(redis: Redis, limit: int | None = None) -> list[dict[str, Any]]:
    """The stored pairs, newest first (``limit``: at most that many); unreadable ones skipped."""
    raw = await redis.lrange(PAIRS_KEY, 0, -1 if limit is None else limit - 1)
    out = []
    for item in raw:
        try:
            obj = orjson.loads(item)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
