"""Prometheus metrics, served at ``GET /metrics``.

A request is recorded once, when it ends (off the client's latency path), into tallies
of this process: a sum per counter and, per histogram, a sum and a count per bucket. They
reach the Prometheus metrics in :meth:`Metrics.sync`, every quarter second and before each
scrape, in one write per counter and per bucket used, not one per request. Counts that
other stages keep as plain integers (retries, hedges, fallbacks, circuit transitions,
dropped Redis writes) are copied in by the same call, so dispatch and the stats writer stay
free of metrics code.

With ``--workers N`` the runner gives every worker the same ``PROMETHEUS_MULTIPROC_DIR``
(a fresh temporary folder per run): prometheus_client's multiprocess mode keeps each
worker's values in memory-mapped files there, and whichever worker answers a scrape
sums them all, so a scrape sees the whole gateway, not one worker. There a write costs
several times what it does in one process (a lock and a write to the mapped file), which is
what the tallies save; the price is that a worker killed outright (``SIGKILL``) loses what it
tallied since its last sync, at most a quarter second of requests.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as _multiprocess

from gateway.cachestats.cost import NANO_USD

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_LABELS = ("deployment", "tier", "stream", "prompt_size")
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
E2E_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300)
ROUTE_SCORE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
CIRCUIT_STATES = {"closed": 0, "half_open": 1, "open": 2}
ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/v1/fanout",
        "/v1/responses",
    }
)
"""``endpoint`` label values; any other path (an unknown one, ``/v1/models/{id}``) is ``other``,
so clients cannot grow the label set."""


def prompt_size(prompt_tokens: int | None) -> str:
    """The ``prompt_size`` label of a prompt of ``prompt_tokens`` tokens: ``lt1k`` (< 1,024),
    ``1k_4k``, ``4k_16k``, ``gt16k`` (>= 16,384), or ``unknown`` when the answer carried no
    usage (an error, say)."""
    if prompt_tokens is None:
        return "unknown"
    if prompt_tokens < 1024:
        return "lt1k"
    if prompt_tokens < 4096:
        return "1k_4k"
    if prompt_tokens < 16384:
        return "4k_16k"
    return "gt16k"


class _Tally:
    """A histogram child's observations since the last sync: their sum and a count per
    bucket, added to the child in one write per bucket used. This reads prometheus_client's
    histogram child (``_upper_bounds``, ``_sum``, ``_buckets``: non-cumulative counts);
    :func:`_tallyable` checks that they are there, else each value is observed as it comes."""

    __slots__ = ("_bounds", "_child", "_counts", "_total")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._bounds: tuple[float, ...] = tuple(child._upper_bounds)
        self._total = 0.0
        self._counts = [0] * len(self._bounds)

    def add(self, value: float) -> None:
        self._total += value
        if value <= self._bounds[-1]:  # as ``observe``: the first bucket whose bound holds it
            self._counts[bisect_left(self._bounds, value)] += 1

    def apply(self) -> None:
        if not any(self._counts) and not self._total:
            return
        child = self._child
        child._sum.inc(self._total)
        for bucket, count in zip(child._buckets, self._counts, strict=True):
            if count:
                bucket.inc(count)
        self._total = 0.0
        self._counts = [0] * len(self._bounds)


def _tallyable(child: Any) -> bool:
    """Whether a histogram child has what :class:`_Tally` writes (prometheus_client's own
    attributes, not its API: checked, never assumed)."""
    bounds, buckets = getattr(child, "_upper_bounds", None), getattr(child, "_buckets", None)
    return (
        isinstance(bounds, list)
        and isinstance(buckets, list)
        and len(bounds) == len(buckets) > 0
        and all(hasattr(v, "inc") for v in (*buckets, getattr(child, "_sum", None)))
    )


class Metrics:
    """The gateway's metrics in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "switchyard_time_to_first_token_seconds",
            "Time from the request's arrival to the first streamed event (streams only).",
            LATENCY_LABELS,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "switchyard_inter_token_latency_seconds",
            "Mean gap between a stream's chunks after the first, one observation per stream.",
            LATENCY_LABELS,
            buckets=ITL_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "switchyard_request_duration_seconds",
            "End-to-end time of a request in the gateway, until its last byte.",
            LATENCY_LABELS,
            buckets=E2E_BUCKETS_S,
            registry=r,
        )
        self.requests = Counter(
            "switchyard_requests",
            "API requests by deployment, tier, HTTP status and error code ('' on success).",
            ("endpoint", "deployment", "tier", "status", "error"),
            registry=r,
        )
        self.prompt_tokens = Counter(
            "switchyard_prompt_tokens", "Prompt tokens the upstreams reported.", ("deployment",), registry=r
        )
        self.cached_tokens = Counter(
            "switchyard_cached_tokens",
            "Prompt tokens the upstreams reported as served from their prefix cache.",
            ("deployment",),
            registry=r,
        )
        self.completion_tokens = Counter(
            "switchyard_completion_tokens", "Completion tokens reported.", ("deployment",), registry=r
        )
        self.cost = Counter(
            "switchyard_cost_usd", "Cost at the policy's prices, in USD.", ("deployment",), registry=r
        )
        self.response_cache = Counter(
            "switchyard_response_cache",
            "Response cache outcomes (hit, miss, store, bypass) by deployment.",
            ("deployment", "outcome"),
            registry=r,
        )
        self.response_cache_saved_usd = Counter(
            "switchyard_response_cache_saved_usd",
            "What the response cache's hits would have cost upstream, in USD.",
            ("deployment",),
            registry=r,
        )
        self.response_cache_saved_tokens = Counter(
            "switchyard_response_cache_saved_tokens",
            "Prompt and completion tokens the response cache's hits did not ask upstream for.",
            ("deployment",),
            registry=r,
        )
        self.retries = Counter("switchyard_retries", "Attempts retried after a failure.", registry=r)
        self.retries_refused = Counter(
            "switchyard_retries_refused_by_budget", "Retries the retry budget refused.", registry=r
        )
        self.hedges = Counter("switchyard_hedges", "Hedged (parallel twin) attempts started.", registry=r)
        self.hedges_won = Counter("switchyard_hedges_won", "Hedged attempts that answered first.", registry=r)
        self.fallbacks = Counter(
            "switchyard_fallbacks", "Requests answered (or tried) on a fallback tier.", registry=r
        )
        self.circuit_transitions = Counter(
            "switchyard_circuit_transitions",
            "Circuit state changes by deployment and the state entered.",
            ("deployment", "state"),
            registry=r,
        )
        self.circuit_state = Gauge(
            "switchyard_circuit_state",
            "Circuit state per deployment: 0 closed, 1 half-open, 2 open (the worst over workers).",
            ("deployment",),
            registry=r,
            multiprocess_mode="livemax",
        )
        self.redis_dropped = Counter(
            "switchyard_redis_writes_dropped",
            "Stats writes to Redis dropped because Redis was slow or down.",
            registry=r,
        )
        self.rate_limit_fail_open = Counter(
            "switchyard_rate_limit_fail_open",
            "Requests of rate-limited keys admitted unchecked because Redis did not answer in time"
            " (limits fail open: see docs/scaling.md).",
            registry=r,
        )
        self.log_lines_dropped = Counter(
            "switchyard_log_lines_dropped", "Log lines dropped because stdout could not keep up.", registry=r
        )
        self.route_decisions = Counter(
            "switchyard_route_decisions",
            "Routing decisions of requests the router decided (model auto, or route_all), by tier and"
            " by what decided: score (the classifier), rule, hint or default.",
            ("tier", "by"),
            registry=r,
        )
        self.route_score = Histogram(
            "switchyard_route_score",
            "The classifier's strong probability per decision it made, by the tier it chose.",
            ("tier",),
            buckets=ROUTE_SCORE_BUCKETS,
            registry=r,
        )
        self.shadow_calls = Counter(
            "switchyard_shadow_calls",
            "Shadow sample outcomes: sampled, stored, failed, skipped_rate, skipped_busy,"
            " skipped_budget, skipped_unavailable, skipped_key, too_large, escalations_stored.",
            ("outcome",),
            registry=r,
        )
        Observe = Callable[[float], None]
        self._route: dict[tuple[str, str], tuple[Any, Observe]] = {}
        self._latency: dict[tuple[str, str, str, str], tuple[Observe, Observe, Observe]] = {}
        self._by_deployment: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._requests: dict[tuple[str, str, str, str, str], Any] = {}
        # Children by label tuple, resolved once each: ``labels()`` costs a lock and a lookup.
        self._cache: dict[tuple[str, str], Any] = {}
        self._cache_saved: dict[str, tuple[Any, Any]] = {}
        self._synced: dict[Any, int] = {}
        # Since the last sync: the amount to add per counter child, and the histograms' tallies.
        self._counts: dict[Any, float] = {}
        self._tallies: list[_Tally] = []

    def _observer(self, child: Any) -> Callable[[float], None]:
        """What records a value into a histogram child: its tally, or ``observe`` itself."""
        if not _tallyable(child):
            return child.observe  # type: ignore[no-any-return]
        tally = _Tally(child)
        self._tallies.append(tally)
        return tally.add

    def record_many(self, batch: Sequence[FinishedRequest]) -> None:
        """Count a batch of finished API requests (a batch sink,
        :mod:`gateway.telemetry.bookkeeping`)."""
        record = self.record
        for done in batch:
            record(done)

    def record(self, done: FinishedRequest) -> None:
        """Count one finished API request."""
        deployment = done.deployment or ""
        tier = done.tier or ""
        endpoint = done.endpoint if done.endpoint in ENDPOINTS else "other"
        key = (endpoint, deployment, tier, str(done.status), (done.error_code or "")[:64])
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(*key)
        counts = self._counts
        counts[child] = counts.get(child, 0) + 1
        route = done.route
        if route is not None and route.reason != "model":
            self._record_route(route.tier or "", route.reason, route.score)
        if not deployment:
            return
        if done.cache is not None and self._record_cache(done, deployment):
            return
        labels = (deployment, tier, "true" if done.stream else "false", prompt_size(done.prompt_tokens))
        hists = self._latency.get(labels)
        if hists is None:
            hists = self._latency[labels] = (
                self._observer(self.ttft.labels(*labels)),
                self._observer(self.itl.labels(*labels)),
                self._observer(self.e2e.labels(*labels)),
            )
        hists[2](done.e2e_ms / 1000.0)
        if done.stream and done.ttft_ms is not None:
            hists[0](done.ttft_ms / 1000.0)
            if done.itl_ms is not None:
                hists[1](done.itl_ms / 1000.0)
        if not (done.prompt_tokens or done.cached_tokens or done.completion_tokens or done.cost_nano_usd):
            return
        counters = self._by_deployment.get(deployment)
        if counters is None:
            counters = self._by_deployment[deployment] = (
                self.prompt_tokens.labels(deployment),
                self.cached_tokens.labels(deployment),
                self.completion_tokens.labels(deployment),
                self.cost.labels(deployment),
            )
        for counter, amount in zip(
            counters,
            (done.prompt_tokens, done.cached_tokens, done.completion_tokens, done.cost_nano_usd / NANO_USD),
            strict=True,
        ):
            if amount:
                counts[counter] = counts.get(counter, 0) + amount

    def _record_cache(self, done: FinishedRequest, deployment: str) -> bool:
        """Count a response cache outcome; True for a hit (no upstream latency nor tokens to
        count: the deployment did not answer it)."""
        counts = self._counts
        outcome = done.cache or ""
        child = self._cache.get((deployment, outcome))
        if child is None:
            child = self._cache[deployment, outcome] = self.response_cache.labels(deployment, outcome)
        counts[child] = counts.get(child, 0) + 1
        if outcome != "hit":
            return False
        saved = self._cache_saved.get(deployment)
        if saved is None:
            saved = self._cache_saved[deployment] = (
                self.response_cache_saved_tokens.labels(deployment),
                self.response_cache_saved_usd.labels(deployment),
            )
        tokens = (done.prompt_tokens or 0) + (done.completion_tokens or 0)
        for counter, amount in (
            (saved[0], tokens),
            (saved[1], done.cache_saved_nano_usd / NANO_USD),
        ):
            if amount:
                counts[counter] = counts.get(counter, 0) + amount
        return True

    def _record_route(self, tier: str, reason: str, score: float | None) -> None:
        by = "rule" if reason.startswith("rule:") else reason
        children = self._route.get((tier, by))
        if children is None:
            children = self._route[tier, by] = (
                self.route_decisions.labels(tier, by),
                self._observer(self.route_score.labels(tier)),
            )
        counts = self._counts
        counts[children[0]] = counts.get(children[0], 0) + 1
        if score is not None:
            children[1](score)

    def shadow_outcome(self, outcome: str) -> None:
        """Count one outcome of the shadow sample (:mod:`gateway.routing.shadow`)."""
        self.shadow_calls.labels(outcome).inc()

    def _add(self, key: Any, counter: Any, total: int) -> None:
        delta = total - self._synced.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._synced[key] = total

    def sync(
        self,
        dispatch_counters: Mapping[str, int],
        transitions: Mapping[tuple[str, str], int],
        circuits: Mapping[str, Mapping[str, Any]],
        redis_dropped: int,
        log_lines_dropped: int,
        rate_limit_fail_open: int = 0,
    ) -> None:
        """Add the requests recorded since the last call, and bring the counters other stages
        keep as integers up to date (cheap: a few dict reads and a write per child used)."""
        counts, self._counts = self._counts, {}
        for child, amount in counts.items():
            child.inc(amount)
        for tally in self._tallies:
            tally.apply()
        add = self._add
        add("retries", self.retries, dispatch_counters.get("retries", 0))
        add("retries_refused", self.retries_refused, dispatch_counters.get("retries_refused_by_budget", 0))
        add("hedges", self.hedges, dispatch_counters.get("hedges", 0))
        add("hedges_won", self.hedges_won, dispatch_counters.get("hedges_won", 0))
        add("fallbacks", self.fallbacks, dispatch_counters.get("fallbacks", 0))
        for (name, state), count in transitions.items():
            add(("circuit", name, state), self.circuit_transitions.labels(name, state), count)
        for name, status in circuits.items():
            self.circuit_state.labels(name).set(CIRCUIT_STATES.get(str(status.get("state")), 0))
        add("redis_dropped", self.redis_dropped, redis_dropped)
        add("log_dropped", self.log_lines_dropped, log_lines_dropped)
        add("rate_limit_fail_open", self.rate_limit_fail_open, rate_limit_fail_open)

    def exposition(self) -> bytes:
        """The text format of every metric: this process's, or all workers' in multiprocess mode."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
