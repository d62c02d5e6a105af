"""The ``dispatch`` section of a policy: timeouts, retries, fallbacks, circuit breakers, hedging."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gateway.dispatch.failures import DEFAULT_RETRY_ON, RETRYABLE
from gateway.validation import Seconds, StrictModel, one_of

RetryReason = Annotated[str, *one_of(RETRYABLE)]
"""A row of :mod:`gateway.dispatch.failures` that may be retried."""


class Timeouts(StrictModel):
    """Each timeout names what it bounds; ``None`` means no bound of that kind.

    - ``connect_s``: TCP (and TLS) connect to the upstream.
    - ``first_token_s``: from sending a streamed request to its first event.
    - ``first_byte_s``: from sending a non-stream request to the first byte of its answer's
      body (headers alone do not count: a server may send them at once and then hang). A
      non-stream answer comes whole, once generated, so this bound is longer than
      ``first_token_s``; it is what tells a hung upstream from a slow answer.
    - ``idle_s``: the longest gap between two reads of a body once it started (streamed
      events, or the rest of a non-stream body).
    - ``total_s``: the whole request, from its first attempt to the last byte received,
      across every retry, fallback and hedge (not per attempt): no retry starts after it.
    """

    connect_s: Seconds | None = Field(None, gt=0)
    first_token_s: Seconds | None = Field(None, gt=0)
    first_byte_s: Seconds | None = Field(None, gt=0)
    idle_s: Seconds | None = Field(None, gt=0)
    total_s: Seconds | None = Field(None, gt=0)

    def over(self, base: Timeouts) -> Timeouts:
        """The timeouts this one sets (``null`` included: no bound), ``base``'s for the rest."""
        return base.model_copy(update={name: getattr(self, name) for name in self.model_fields_set})


DEFAULT_TIMEOUTS = Timeouts(connect_s=5.0, first_token_s=60.0, first_byte_s=120.0, idle_s=60.0, total_s=600.0)
"""What applies where neither the deployment nor ``dispatch.timeouts`` says otherwise."""


class Backoff(StrictModel):
    """Exponential backoff with full jitter: before the n-th retry of the same deployment,
    sleep a uniform random time in ``[0, min(max_s, base_s * 2**(n-1))]``."""

    base_s: Seconds = Field(0.2, ge=0)
    max_s: Seconds = Field(5.0, ge=0)


class RetryBudget(StrictModel):
    """Retries may be at most ``ratio`` of the requests of the last ``window_s`` seconds
    (but ``min_per_s`` per second are always allowed), so an outage cannot turn into a
    retry storm. Counted per gateway process."""

    ratio: float = Field(0.2, ge=0, le=10)
    min_per_s: float = Field(1.0, ge=0)
    window_s: Seconds = Field(10.0, gt=0, le=300)


class Retries(StrictModel):
    """Which failures are retried and how. An attempt is retried only before any byte of
    its answer went to the client; a retry goes to the next available deployment of the
    route (its own tier first, then the fallback tiers), or to the same one after a backoff."""

    max: int = Field(2, ge=0, le=10, description="Extra attempts after the first.")
    retry_on: list[RetryReason] = Field(default_factory=lambda: list(DEFAULT_RETRY_ON))
    backoff: Backoff = Field(default_factory=Backoff)
    retry_after_cap_s: Seconds = Field(
        10.0, ge=0, description="A Retry-After up to this is waited for; a longer one is not."
    )
    budget: RetryBudget = Field(default_factory=RetryBudget)


class CircuitPolicy(StrictModel):
    """A deployment's circuit opens after ``consecutive_failures`` failures in a row, or when
    at least ``min_requests`` attempts in ``window_s`` failed at ``failure_rate`` or more. After
    ``cooldown_s`` it lets ``half_open_probes`` attempts through: a success closes it, a failure
    opens it again. With ``shared``, an opened circuit is published in Redis so every replica
    of the gateway skips the deployment too.

    Timeouts are judged relative to the deployment's peers (outlier ejection, as Envoy's):
    while every failure in the window is one of the gateway's own timeouts, the circuit opens
    only when the deployment fails clearly more often than the other deployments of its tiers
    (``outlier_margin``), and only while at most ``max_open_share`` of each of its tiers (never
    all of it) is open for timeouts: a machine busy enough to slow every deployment is not
    taken for one that is down."""

    enabled: bool = True
    consecutive_failures: int = Field(5, ge=1)
    failure_rate: float = Field(0.5, gt=0, le=1)
    min_requests: int = Field(10, ge=1)
    window_s: Seconds = Field(30.0, gt=0)
    cooldown_s: Seconds = Field(15.0, gt=0)
    half_open_probes: int = Field(1, ge=1)
    shared: bool = True
    outlier_margin: float = Field(
        0.25,
        ge=0,
        le=1,
        description="When every failure in the window is a timeout of the gateway's own, the circuit "
        "opens only if the deployment's failure rate exceeds its tier peers' by this much.",
    )
    max_open_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="On timeouts alone, at most this share of a tier's deployments is open at once "
        "(and never all of them); other failures are not capped.",
    )


class HedgePolicy(StrictModel):
    """When no first token (stream) or answer (non-stream) arrived ``after_s`` seconds into an
    attempt, start one more on the next available deployment of the route; the first to
    deliver wins and the other is cancelled. ``after_s: p95`` uses the deployment's recent
    p95 (time to first token for streams, to the whole answer otherwise), floored at
    ``min_after_s`` and, until enough samples exist, ``default_after_s``."""

    enabled: bool = False
    after_s: Seconds | Literal["p95"] = "p95"
    min_after_s: Seconds = Field(0.05, ge=0)
    default_after_s: Seconds = Field(1.0, gt=0)
    max_extra: int = Field(1, ge=1, le=3)
    budget_ratio: float = Field(0.2, ge=0, le=1, description="Hedges at most this share of requests.")
    budget_min_per_s: float = Field(
        1.0,
        ge=0,
        description="Hedges always allowed per second, whatever the share (so a quiet gateway hedges too).",
    )


class DispatchPolicy(StrictModel):
    """Gateway-wide dispatch settings. Timeouts apply in layers: a deployment's own, then its
    tier's (``tier_timeouts``), then ``timeouts``, then the defaults; a request may tighten
    them (header ``x-switchyard-timeout``)."""

    timeouts: Timeouts = Timeouts()
    tier_timeouts: dict[str, Timeouts] = Field(default_factory=dict)
    retries: Retries = Field(default_factory=Retries)
    fallback: dict[str, list[str]] = Field(
        default_factory=dict, description="Tier -> tiers tried, in order, when its own deployments fail."
    )
    circuit: CircuitPolicy = Field(default_factory=CircuitPolicy)
    hedge: HedgePolicy = Field(default_factory=HedgePolicy)
