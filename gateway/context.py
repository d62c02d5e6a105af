"""The one object a request carries through every stage."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.config import PolicySnapshot
from gateway.dispatch.policy import Timeouts

if TYPE_CHECKING:
    from gateway.auth.keys import KeyRecord
    from gateway.cache.key import CachePlan
    from gateway.routing.resolve import Route
    from gateway.shaping.shaper import ShapeResult


@dataclass(slots=True)
class RequestContext:
    """What the stages learn about one request; read at the end for the log line and stats.

    Times are ``time.perf_counter()`` readings; ``*_ms`` properties derive the durations.
    """

    request_id: str
    endpoint: str
    snapshot: PolicySnapshot
    started: float = field(default_factory=time.perf_counter)
    key_id: str | None = None
    key: KeyRecord | None = None
    requested_model: str | None = None
    tier: str | None = None
    route_reason: str | None = None
    route: Route | None = None
    """The router's decision, as made (an escalation changes ``tier``, not this)."""
    deployment: str | None = None
    stream: bool = False
    attempts: int = 0
    retries: int = 0
    hedged: bool = False
    escalated: str | None = None
    shape: ShapeResult | None = None
    prefix_chain: Sequence[int] | None = None
    prefix_hit_tokens: int | None = None
    fallback_tier: str | None = None
    timeout_override: Timeouts | None = None
    status: int = 0
    error_code: str | None = None
    error_detail: str | None = None
    """What the client's plain error message leaves out (for the log line and the trace)."""
    first_token_at: float | None = None
    last_chunk_at: float | None = None
    finished_at: float | None = None
    chunks: int = 0
    usage: dict[str, Any] | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    cache: CachePlan | None = None
    """What the response cache does for this request (None: it is not for it)."""
    cache_hit: bool = False
    """Answered from the response cache: nothing was sent upstream, nothing billed."""
    tracer: Any = None
    """The OpenTelemetry tracer while tracing is on (None: off, and no span is made)."""
    span: Any = None
    """The request's span while tracing is on."""

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_at is None:
            return None
        return (self.first_token_at - self.started) * 1000.0

    @property
    def total_ms(self) -> float:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        return (end - self.started) * 1000.0

    @property
    def itl_ms(self) -> float | None:
        """Mean gap between the streamed chunks (upstream reads carrying events) after the first."""
        if self.first_token_at is None or self.last_chunk_at is None or self.chunks < 2:
            return None
        return (self.last_chunk_at - self.first_token_at) * 1000.0 / (self.chunks - 1)

    def usage_int(self, key: str) -> int | None:
        if not self.usage:
            return None
        value = self.usage.get(key)
        return value if isinstance(value, int) else None

    @property
    def cached_tokens(self) -> int | None:
        if not self.usage:
            return None
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            value = details.get("cached_tokens")
            if isinstance(value, int):
                return value
        return None
