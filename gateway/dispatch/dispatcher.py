"""Dispatch: run a routed request as attempts on deployments until one answers.

The candidates are the route's deployments in order, then those of the tier's fallback
tiers. An attempt that fails before any byte went to the client is retried, if its
reason is in ``retries.retry_on``, attempts are left and the retry budget of the
deployment the retry goes to allows it: on the next candidate not yet tried, else on one
already tried after an exponential backoff with full jitter (or its Retry-After, up to a
cap). Budgets are per deployment (as Envoy's are per cluster), so retries that piled up
on a failing deployment never refuse a fallback to a healthy one. A deployment whose circuit
is open, or that is not ready, is skipped. With hedging on, a slow attempt gets a
parallel twin on the next candidate; the first to deliver wins and the other is cancelled.

``total_s`` (of the first attempt's deployment) bounds the whole request: every attempt
ends by then and no retry starts after it. When every candidate's circuit is open, the
request is sent anyway (panic routing, as Envoy does when too few hosts are healthy):
a tier is never refused without one of its deployments being tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.context import RequestContext
from gateway.dispatch.attempt import OpenStream, UnaryResult, stream_attempt, unary_attempt
from gateway.dispatch.backoff import full_jitter_s
from gateway.dispatch.budget import Budget, LatencyWindow
from gateway.dispatch.circuit import Breakers
from gateway.dispatch.clock import SYSTEM_CLOCK, Clock
from gateway.dispatch.failures import (
    failure,
    failure_reason,
    is_unwell,
    may_retry,
    retries_same_deployment,
)
from gateway.dispatch.hedge import HedgeRace
from gateway.dispatch.policy import HedgePolicy, Timeouts
from gateway.errors import RateLimitError, SwitchyardError, UpstreamUnavailableError
from gateway.policy import Policy
from gateway.providers.base import Provider
from gateway.providers.pool import UpstreamPool
from gateway.routing.resolve import Route
from gateway.telemetry import tracing

__all__ = ["Dispatcher", "OpenStream", "UnaryResult", "failure_reason"]

T = TypeVar("T")
Attempt = Callable[[Provider, Timeouts, "float | None"], Awaitable[T]]
"""One attempt on a deployment: its provider, its timeouts, and the request's deadline
(event-loop time, from ``total_s``; ``None``: no bound)."""
Adapt = Callable[[Provider], Provider]


def tighten(timeouts: Timeouts, request: Timeouts | None) -> Timeouts:
    """``timeouts`` with each bound the request set lowered to it (a client can shorten, never lengthen)."""
    if request is None:
        return timeouts
    update: dict[str, float] = {}
    for name in request.model_fields_set:
        value = getattr(request, name)
        current = getattr(timeouts, name)
        if value is not None and (current is None or value < current):
            update[name] = value
    return timeouts.model_copy(update=update) if update else timeouts


@dataclass(slots=True)
class _Candidate:
    name: str
    tier: str | None
    fallback: bool


@dataclass(slots=True)
class _Run:
    """The state of one request's attempts."""

    candidates: list[_Candidate]
    tries: dict[str, int] = field(default_factory=dict)
    cooling_until: dict[str, float] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    deadline: float | None = None
    """Event-loop time by which the whole request must end (set by the first attempt)."""
    total_s: float | None = None


class Dispatcher:
    """Runs attempts on the deployments a route names; holds the circuits and budgets."""

    def __init__(self, pool: UpstreamPool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.pool = pool
        self.clock = clock
        self.breakers = Breakers(clock)
        self.retry_budgets: dict[str, Budget] = {}
        """Deployment -> the budget of the retries sent to it."""
        self._retry_budget_args = (0.2, 1.0, 10.0)
        self.hedge_budget = Budget(0.2, 1.0, 10.0, clock)
        self._latency: dict[tuple[str, bool], LatencyWindow] = {}
        self.counters: dict[str, int] = {
            "retries": 0,
            "retries_refused_by_budget": 0,
            "fallbacks": 0,
            "hedges": 0,
            "hedges_won": 0,
            "panic_routed": 0,
        }

    def configure(self, policy: Policy) -> None:
        """Apply a (re)loaded policy's dispatch section."""
        dispatch = policy.dispatch
        self.breakers.configure(dispatch.circuit)
        self.breakers.watch(list(policy.deployments))
        self.breakers.set_tiers([[m.deployment for m in members] for members in policy.tiers.values()])
        budget = dispatch.retries.budget
        self._retry_budget_args = (budget.ratio, budget.min_per_s, budget.window_s)
        for retry_budget in self.retry_budgets.values():
            retry_budget.configure(*self._retry_budget_args)
        self.hedge_budget.configure(
            dispatch.hedge.budget_ratio, dispatch.hedge.budget_min_per_s, budget.window_s
        )

    def available(self, name: str) -> bool:
        """Whether routing may choose ``name`` now: its circuit is not open and it is ready."""
        if self.breakers.is_open(name):
            return False
        try:
            return self.pool.get(name).ready
        except KeyError:
            return False

    def status(self) -> dict[str, Any]:
        """Circuits, counters and budgets, JSON-ready (for the admin API)."""
        return {
            "circuits": self.breakers.status(),
            "counters": dict(self.counters),
            "retry_budget": {
                "spent": sum(b.spent for b in self.retry_budgets.values()),
                "refused": sum(b.refused for b in self.retry_budgets.values()),
                "deployments": {
                    name: {"spent": b.spent, "refused": b.refused} for name, b in self.retry_budgets.items()
                },
            },
            "hedge_budget": {"spent": self.hedge_budget.spent, "refused": self.hedge_budget.refused},
        }

    async def unary(
        self,
        ctx: RequestContext,
        route: Route,
        endpoint: str,
        body: dict[str, Any],
        adapt: Adapt | None = None,
    ) -> UnaryResult:
        """A non-stream request, answered whole. ``adapt`` wraps each attempt's provider
        (an endpoint dialect that a deployment serves natively or translated)."""

        async def attempt(upstream: Provider, timeouts: Timeouts, deadline: float | None) -> UnaryResult:
            if adapt is not None:
                upstream = adapt(upstream)
            return await unary_attempt(ctx, self.pool, upstream, timeouts, endpoint, body, deadline)

        return await self._run(ctx, route, attempt, stream=False)

    async def open_stream(
        self,
        ctx: RequestContext,
        route: Route,
        endpoint: str,
        body: dict[str, Any],
        adapt: Adapt | None = None,
    ) -> OpenStream:
        """A stream request, returned once its first event arrived (nothing sent to the client yet)."""

        async def attempt(upstream: Provider, timeouts: Timeouts, deadline: float | None) -> OpenStream:
            if adapt is not None:
                upstream = adapt(upstream)
            return await stream_attempt(ctx, self.pool, upstream, timeouts, endpoint, body, deadline)

        opened = await self._run(ctx, route, attempt, stream=True)
        name = opened.upstream.name
        started = self.clock.now()
        opened.on_error = lambda exc: self.breakers.record(
            name, not is_unwell(exc), started_at=started, reason=failure_reason(exc)
        )
        ctx.first_token_at = ctx.last_chunk_at = time.perf_counter()
        ctx.chunks = opened.scanner.chunks
        tracing.first_token(ctx)
        return opened

    def _retry_budget(self, name: str) -> Budget:
        budget = self.retry_budgets.get(name)
        if budget is None:
            ratio, min_per_s, window_s = self._retry_budget_args
            budget = self.retry_budgets[name] = Budget(ratio, min_per_s, window_s, self.clock)
        return budget

    def _candidates(self, policy: Policy, route: Route) -> list[_Candidate]:
        out = [_Candidate(name, route.tier, False) for name in route.deployments]
        seen = set(route.deployments)
        if route.tier is not None:
            for tier in policy.dispatch.fallback.get(route.tier, ()):
                for member in policy.tiers.get(tier, ()):
                    if member.deployment not in seen:
                        seen.add(member.deployment)
                        out.append(_Candidate(member.deployment, tier, True))
        return out

    async def _run(self, ctx: RequestContext, route: Route, attempt: Attempt[T], stream: bool) -> T:
        policy = ctx.snapshot.policy
        retries = policy.dispatch.retries
        run = _Run(self._candidates(policy, route))
        now = self.clock.now()
        self.hedge_budget.note_request(now)
        for candidate in run.candidates:
            # A request counts for every deployment it may go to: the one that takes over
            # when another fails has the share of all of them to spend.
            self._retry_budget(candidate.name).note_request(now)
        hedged = policy.dispatch.hedge.enabled
        last: SwitchyardError | None = None
        extra = 0
        retrying = False
        while True:
            picked = self._pick(run, retries.backoff.base_s, retries.backoff.max_s)
            if picked is None and last is None:
                picked = self._panic_pick(run)
            if picked is None:
                if last is not None:
                    raise last
                why = "; ".join(f"{c.name} {self._unavailable_because(c.name)}" for c in run.candidates)
                raise UpstreamUnavailableError(f"no deployment can take the request now: {why}")
            candidate, wait_s = picked
            if run.deadline is not None:
                left_s = run.deadline - asyncio.get_running_loop().time()
                if left_s <= wait_s:
                    # No retry starts that could not end within total_s.
                    self.breakers.abandon(candidate.name)  # a half-open probe it may hold
                    if last is not None:
                        raise last
                    raise failure("total_timeout", f"the request did not finish within total_s={run.total_s}")
            if retrying:
                # Charged to the deployment the retry goes to: a fallback to a healthy one is
                # not refused by the retries the failing one used up.
                if not self._retry_budget(candidate.name).try_spend():
                    self.counters["retries_refused_by_budget"] += 1
                    self.breakers.abandon(candidate.name)
                    assert last is not None
                    raise last
                extra += 1
                ctx.retries += 1
                self.counters["retries"] += 1
            if wait_s > 0:
                await self.clock.sleep(wait_s)
            try:
                if hedged:
                    return await self._attempt_hedged(ctx, run, candidate, attempt, stream)
                return await self._one(ctx, run, candidate, attempt, stream)
            except SwitchyardError as exc:
                last = exc
                if not may_retry(exc, retries.retry_on) or extra >= retries.max:
                    raise
                if isinstance(exc, RateLimitError) and exc.retry_after_s is not None:
                    # Honour Retry-After for that deployment; one that asks for longer than the
                    # cap is not waited for (another deployment may answer, else the 429 goes out).
                    wait = exc.retry_after_s
                    run.cooling_until[candidate.name] = (
                        math.inf if wait > retries.retry_after_cap_s else self.clock.now() + wait
                    )
                retrying = True

    def _pick(self, run: _Run, base_s: float, max_s: float) -> tuple[_Candidate, float] | None:
        """The next candidate and how long to wait first: an untried one at once (a ready one
        first), else the least-tried one after its backoff (or Retry-After)."""
        if not run.tries and not run.running:
            # The first attempt (the usual case): every candidate is fresh and idle.
            for need_ready in (True, False):
                for candidate in run.candidates:
                    if self._admit(candidate.name, need_ready):
                        return candidate, 0.0
            return None
        now = self.clock.now()
        idle = [c for c in run.candidates if c.name not in run.running]
        fresh = [c for c in idle if c.name not in run.tries]
        # A deployment that is not ready (a vLLM still loading) is tried only when nothing
        # ready is left: its own error then says why it is not ready.
        for need_ready in (True, False):
            for candidate in fresh:
                if self._admit(candidate.name, need_ready):
                    return candidate, 0.0
        tried = sorted((c for c in idle if c.name in run.tries), key=lambda c: run.tries[c.name])
        for candidate in tried:
            cooling = run.cooling_until.get(candidate.name, 0.0)
            if cooling == math.inf or not self._admit(candidate.name, False):
                continue
            backoff = full_jitter_s(run.tries[candidate.name], base_s, max_s)
            return candidate, max(backoff, cooling - now)
        return None

    def _panic_pick(self, run: _Run) -> tuple[_Candidate, float] | None:
        """Every candidate's circuit is open: try the first configured one anyway (panic
        routing), so a tier whose breakers all tripped at once still answers when its
        deployments have recovered (a success closes the circuit)."""
        for need_ready in (True, False):
            for candidate in run.candidates:
                if candidate.name in run.running or candidate.name in run.tries:
                    continue
                try:
                    provider = self.pool.get(candidate.name)
                except KeyError:
                    continue
                if need_ready and not provider.ready:
                    continue
                self.counters["panic_routed"] += 1
                return candidate, 0.0
        return None

    def _unavailable_because(self, name: str) -> str:
        if name not in self.pool.in_flight:
            return "is not configured"
        return "has its circuit open"

    def _admit(self, name: str, need_ready: bool) -> bool:
        if need_ready:
            try:
                if not self.pool.get(name).ready:
                    return False
            except KeyError:
                return False
        return self.breakers.available(name)

    async def _one(
        self,
        ctx: RequestContext,
        run: _Run,
        candidate: _Candidate,
        attempt: Attempt[T],
        stream: bool,
        hedge: bool = False,
    ) -> T:
        name = candidate.name
        run.tries[name] = run.tries.get(name, 0) + 1
        run.running.add(name)
        ctx.attempts += 1
        ctx.deployment = name
        if candidate.fallback and ctx.fallback_tier is None:
            ctx.fallback_tier = candidate.tier
            self.counters["fallbacks"] += 1
        timeouts = tighten(ctx.snapshot.timeouts(name, candidate.tier), ctx.timeout_override)
        if run.deadline is None and timeouts.total_s is not None:
            run.total_s = timeouts.total_s
            run.deadline = asyncio.get_running_loop().time() + timeouts.total_s
        started = self.clock.now()
        # Without a tracer no span is made: a shared no-op scope, not a generator per attempt.
        scope = (
            _NO_SPAN
            if ctx.tracer is None
            else tracing.attempt_span(ctx, name, candidate.tier, hedge, candidate.fallback)
        )
        with scope as span:
            try:
                try:
                    upstream = self.pool.acquire(name)
                except KeyError:
                    raise UpstreamUnavailableError(f"deployment '{name}' is not available") from None
                result = await attempt(upstream, timeouts, run.deadline)
            except SwitchyardError as exc:
                reason = failure_reason(exc)
                tracing.attempt_outcome(span, reason or "error", exc.upstream_status)
                self.breakers.record(name, not is_unwell(exc), started_at=started, reason=reason)
                if not retries_same_deployment(exc):
                    # Rejected credentials stay rejected: fall back, never back here.
                    run.cooling_until[name] = math.inf
                raise
            except asyncio.CancelledError:
                tracing.attempt_outcome(span, "cancelled")
                self.breakers.abandon(name)
                raise
            finally:
                run.running.discard(name)
            tracing.attempt_outcome(span, "ok")
        self.breakers.record(name, True, started_at=started)
        self._window(name, stream).add(self.clock.now() - started)
        return result

    def _window(self, name: str, stream: bool) -> LatencyWindow:
        window = self._latency.get((name, stream))
        if window is None:
            window = self._latency[name, stream] = LatencyWindow(clock=self.clock)
        return window

    def _hedge_delay(self, name: str, hedge: HedgePolicy, stream: bool) -> float:
        if hedge.after_s != "p95":
            return float(hedge.after_s)
        p95 = self._window(name, stream).p95()
        return max(hedge.min_after_s, p95 if p95 is not None else hedge.default_after_s)

    async def _attempt_hedged(
        self, ctx: RequestContext, run: _Run, candidate: _Candidate, attempt: Attempt[T], stream: bool
    ) -> T:
        """The attempt on ``candidate``, run in this task; each hedge delay it has not
        delivered, a twin on the next candidate (:class:`HedgeRace`: a request that is not
        slow creates no task). The first to deliver wins; the others are cancelled."""
        hedge = ctx.snapshot.policy.dispatch.hedge

        def start_twin() -> tuple[asyncio.Task[T], str] | None:
            twin = self._hedge_candidate(run)
            if twin is None or not self.hedge_budget.try_spend():
                return None
            ctx.hedged = True
            self.counters["hedges"] += 1
            return asyncio.ensure_future(self._one(ctx, run, twin, attempt, stream, hedge=True)), twin.name

        race = HedgeRace(start_twin, hedge.max_extra, self._hedge_delay(candidate.name, hedge, stream))
        try:
            try:
                result = await self._one(ctx, run, candidate, attempt, stream)
            except asyncio.CancelledError:
                if not race.twin_won():
                    raise
                won = race.winner
            except SwitchyardError as exc:
                if not race.twins:
                    raise
                won = await race.await_twins(exc)
            else:
                ctx.deployment = candidate.name
                return result
            assert won is not None
            ctx.deployment = race.twins[won]
            self.counters["hedges_won"] += 1
            return race.take(won)
        finally:
            await race.end()

    def _hedge_candidate(self, run: _Run) -> _Candidate | None:
        for candidate in run.candidates:
            if (
                candidate.name not in run.tries
                and candidate.name not in run.running
                and self._admit(candidate.name, True)
            ):
                return candidate
        return None


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()
