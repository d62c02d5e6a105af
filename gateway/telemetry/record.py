"""The finished-request record: what every sink of a finished request reads.

Built once per request, when it ends (off the client's latency path), from its
:class:`~gateway.context.RequestContext`: the durations derived, the usage read and the
cost priced once (:mod:`gateway.cachestats.cost`), so the log line, the Prometheus
metrics, the dashboard counters, the cache stats and the key's spend all report the same
figures.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.cachestats.cost import cost_nano_usd

if TYPE_CHECKING:
    from gateway.auth.keys import KeyRecord
    from gateway.context import RequestContext
    from gateway.routing.resolve import Route
    from gateway.shaping.shaper import ShapeResult


@dataclass(slots=True)
class FinishedRequest:
    """One finished API request, as its sinks see it. Token counts are None when the answer
    carried no usage; ``cost_nano_usd`` is 0 without a priced deployment.

    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, which
    makes building one several times dearer; no sink writes to it."""

    request_id: str
    endpoint: str
    key_id: str | None
    key: KeyRecord | None
    requested_model: str | None
    tier: str | None
    deployment: str | None
    stream: bool
    status: int
    error_code: str | None
    attempts: int
    retries: int
    hedged: bool
    fallback_tier: str | None
    e2e_ms: float
    ttft_ms: float | None
    itl_ms: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    cost_nano_usd: int
    shape: ShapeResult | None
    prefix_chain: Sequence[int] | None
    cache_ttl_s: float
    ended_at: float
    """Wall-clock time (``time.time()``) the request ended: its minute's stats bucket and
    its log line's timestamp, however late the batch that folds it."""
    route: Route | None = None
    """The router's decision (tier, reason, classifier score), before any escalation."""
    error_detail: str | None = None
    """The failure as the gateway saw it (the client got a plain message)."""
    cache: str | None = None
    """The response cache's outcome (hit, miss, store, bypass); None when it was not used."""
    cache_saved_nano_usd: int = 0
    """What a cache hit would have cost upstream (its own cost is 0)."""
    cache_entry: str | None = None
    """The id of the entry that answered a hit."""
    cache_similarity: float | None = None
    """A semantic hit's similarity."""
    cache_template: str | None = None
    """A hit's template, as its entry recorded it (a hit is not shaped: ``shape`` is None)."""

    @property
    def failed(self) -> bool:
        """An error status, or an error after the answer started (a stream's error event)."""
        return self.status >= 400 or bool(self.error_code)


def finished_request(ctx: RequestContext) -> FinishedRequest:
    """The record of ``ctx``, which has ended (``finished_at`` set)."""
    policy = ctx.snapshot.policy
    cost = 0
    if ctx.deployment is not None:
        found = policy.deployments.get(ctx.deployment)
        cost = cost_nano_usd(found.price if found is not None else None, ctx.usage)
    plan = ctx.cache
    saved = 0
    if ctx.cache_hit:
        # Nothing went upstream: the hit bills nothing, and saves what the answer cost.
        cost, saved = 0, cost
    return FinishedRequest(
        request_id=ctx.request_id,
        endpoint=ctx.endpoint,
        key_id=ctx.key_id,
        key=ctx.key,
        requested_model=ctx.requested_model,
        tier=ctx.tier,
        deployment=ctx.deployment,
        stream=ctx.stream,
        status=ctx.status,
        error_code=ctx.error_code,
        attempts=ctx.attempts,
        retries=ctx.retries,
        hedged=ctx.hedged,
        fallback_tier=ctx.fallback_tier,
        e2e_ms=ctx.total_ms,
        ttft_ms=ctx.ttft_ms,
        itl_ms=ctx.itl_ms,
        prompt_tokens=ctx.usage_int("prompt_tokens"),
        cached_tokens=ctx.cached_tokens,
        completion_tokens=ctx.usage_int("completion_tokens"),
        cost_nano_usd=cost,
        shape=ctx.shape,
        prefix_chain=ctx.prefix_chain,
        cache_ttl_s=policy.shaping.cache_ttl_s,
        ended_at=time.time(),
        route=ctx.route,
        error_detail=ctx.error_detail,
        cache=plan.outcome if plan is not None else None,
        cache_saved_nano_usd=saved,
        cache_entry=plan.entry_id if plan is not None else None,
        cache_similarity=plan.similarity if plan is not None else None,
        cache_template=plan.template if plan is not None else None,
    )
