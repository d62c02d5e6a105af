"""One request through the stages: prepare (validate, shape, route) -> admit -> dispatch ->
prefix expectation, and the bookkeeping when it ends.

Every endpoint and every fan-out item runs these functions; the HTTP layer only reads the
body and writes the answer. :class:`Stages` is built once, by the app, from the resources
it started (``gateway.http.app`` is the one place that wires them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from pydantic import BaseModel

from gateway.api.protocol import ChatCompletionRequest, check_limits, validate
from gateway.auth.limits import Limiter
from gateway.cache.entry import Entry
from gateway.cache.key import CachePlan, plan_request, settle
from gateway.cache.service import HEADER as CACHE_HEADER
from gateway.cache.service import (
    AnswerStream,
    RecordingStream,
    ResponseCache,
    hit,
    keep_answer,
    replay_stream,
    unary_hit,
)
from gateway.config import Settings
from gateway.context import RequestContext
from gateway.dispatch.dispatcher import Dispatcher, UnaryResult
from gateway.errors import PermissionDeniedError
from gateway.providers.base import Provider
from gateway.routing.escalation import escalation_route
from gateway.routing.resolve import Route
from gateway.routing.shadow import ShadowSampler
from gateway.shaping.service import ShapingState, pop_gateway_metadata, template_hint
from gateway.store.writer import StatsWriter
from gateway.telemetry import tracing
from gateway.telemetry.record import FinishedRequest, finished_request

Sink = Callable[[FinishedRequest], None]


class Dialect(Protocol):
    """An endpoint whose requests a deployment may serve natively or translated (the
    Responses API): how the router reads the request, and the provider per attempt."""

    def routing_view(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request as a chat body, for the router's features."""

    def adapt(self, inner: Provider) -> Provider:
        """The deployment's provider as this request's provider."""


@dataclass(slots=True, frozen=True)
class Stages:
    """The stages a request runs through, and the sinks its finished record goes to."""

    settings: Settings
    shaping: ShapingState
    dispatcher: Dispatcher
    limiter: Limiter
    stats: StatsWriter
    sinks: tuple[Sink, ...]
    shadow: ShadowSampler | None = None
    cache: ResponseCache | None = None


async def run_unary(
    stages: Stages,
    ctx: RequestContext,
    schema: type[BaseModel],
    endpoint: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    dialect: Dialect | None = None,
) -> UnaryResult:
    """A non-stream request, prepared, admitted and answered; a fast chat answer that fails
    the policy's escalation check is asked again, once, of the escalation tier."""
    route, late = _prepare(stages, ctx, schema, body, headers, dialect, endpoint)
    await _admit(stages, ctx)
    plan = ctx.cache
    if plan is not None and plan.read:
        cached = await _lookup(stages, ctx, plan)
        if cached is not None:
            return unary_hit(plan, cached)
    if late is not None:
        _shape(stages, ctx, body, *late)
    adapt = dialect.adapt if dialect is not None else None
    result = await stages.dispatcher.unary(ctx, route, endpoint, body, adapt)
    # Only a chat answer is checked: every check reads its message.
    if endpoint == "/chat/completions":
        escalation = escalation_route(ctx.snapshot.policy, route, body, result.body)
        shadow = stages.shadow if dialect is None else None
        if escalation is not None:
            ctx.escalated, stronger = escalation
            _set_route(ctx, stronger)
            first, first_deployment = result.body, ctx.deployment
            result = await stages.dispatcher.unary(ctx, stronger, endpoint, body)
            if shadow is not None:
                shadow.escalated(ctx, route, body, first, first_deployment, result.body)
        elif shadow is not None:
            shadow.after_answer(ctx, route, body, result.body)
    stages.shaping.prefix_hit(ctx)
    if plan is not None and plan.write:
        _keep_unary(stages, ctx, plan, body, result)
    return result


async def open_stream(
    stages: Stages,
    ctx: RequestContext,
    schema: type[BaseModel],
    endpoint: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    dialect: Dialect | None = None,
) -> AnswerStream:
    """A stream request, prepared, admitted and opened: its first bytes are in hand (a
    response cache hit: all of them)."""
    route, late = _prepare(stages, ctx, schema, body, headers, dialect, endpoint)
    await _admit(stages, ctx)
    ctx.stream = True
    plan = ctx.cache
    if plan is not None and plan.read:
        cached = await _lookup(stages, ctx, plan)
        if cached is not None:
            return replay_stream(plan, cached, body)
    if late is not None:
        _shape(stages, ctx, body, *late)
    adapt = dialect.adapt if dialect is not None else None
    opened = await stages.dispatcher.open_stream(ctx, route, endpoint, body, adapt)
    stages.shaping.prefix_hit(ctx)
    if plan is not None and plan.write and plan.key and stages.cache is not None:
        answering = _answering_plan(ctx, plan)
        if answering is not None:
            # The headers leave before the end: `store` says the answer will be kept if it
            # ends whole and valid (RecordingStream sets what happened, for the stats).
            answering.outcome = "store"
            ctx.response_headers[CACHE_HEADER] = "store"
            policy = ctx.snapshot.policy.cache
            return RecordingStream(stages.cache, answering, ctx, body, opened, policy, _template(ctx))
    return opened


def finish(stages: Stages, ctx: RequestContext) -> None:
    """Hand the finished request's record to every sink (called off the latency path)."""
    if ctx.finished_at is None:
        ctx.finished_at = time.perf_counter()
    done = finished_request(ctx)
    for sink in stages.sinks:
        sink(done)


def _prepare(
    stages: Stages,
    ctx: RequestContext,
    schema: type[BaseModel],
    body: dict[str, Any],
    headers: Mapping[str, str],
    dialect: Dialect | None = None,
    endpoint: str = "",
) -> tuple[Route, tuple[str | None, bytes | None] | None]:
    """Validate, shape (chat) and route a request body. The gateway-only hints (tier,
    template) come from headers or ``metadata`` and are not sent upstream. The response
    cache's key is taken before shaping (the stability model may shape a request
    differently over time). A request the cache will look up is routed as the client sent
    it and shaped only once the lookup missed (a hit sends nothing upstream: nothing to
    shape): then the second value is what :func:`_shape` needs, else None."""
    settings = stages.settings
    tools_json = check_limits(
        body,
        max_depth=settings.max_json_depth,
        max_messages=settings.max_messages,
        max_content_parts=settings.max_content_parts,
    )
    validate(schema, body)
    ctx.requested_model = body["model"]
    hints = pop_gateway_metadata(body)
    plan: CachePlan | None = None
    snapshot = ctx.snapshot
    if snapshot.cache_active and stages.cache is not None:
        key = ctx.key
        name = key.name if key else None
        plan = plan_request(snapshot.policy.cache, endpoint, body, headers, ctx.key_id, name, tools_json)
    if ctx.span is not None:
        tracing.request_attributes(ctx, body)
    late: tuple[str | None, bytes | None] | None = None
    if schema is ChatCompletionRequest:
        template = template_hint(headers.get("x-switchyard-template"), hints.get("switchyard_template"))
        late = (template, tools_json)
        if plan is None or not plan.read:
            _shape(stages, ctx, body, *late)
            late = None
    dispatcher = stages.dispatcher
    hint = headers.get("x-switchyard-tier") or hints.get("switchyard_tier")
    with tracing.child(ctx, "route") as span:
        # The canonical tools shaping put in the body have the length of the client's: only
        # keys moved. Another dialect's routing view has tools of another form, and is made
        # only when the router reads more than the model name and the hint.
        if dialect is None:
            view, tool_chars = body, len(tools_json) if tools_json is not None else None
        elif not snapshot.router.reads_body(str(body.get("model", ""))):
            view, tool_chars = body, None
        else:
            view, tool_chars = dialect.routing_view(body), None
        route = snapshot.router.resolve(
            view, hint, dispatcher.available, dispatcher.pool.in_flight, tool_chars
        )
        _set_route(ctx, route)
        ctx.route = route
        if span is not None:
            span.set_attributes(
                {
                    "switchyard.tier": route.tier or "",
                    "switchyard.route_reason": route.header(),
                    "switchyard.candidates": list(route.deployments),
                }
            )
    key = ctx.key
    if key is not None and not key.allows(ctx.requested_model, route.tier):
        raise PermissionDeniedError(
            f"The key '{key.name}' may not use the model '{ctx.requested_model}'.",
            param="model",
            code="model_not_allowed",
        )
    if plan is not None and route.deployments:
        _settle(ctx, plan, route)
    if late is not None and ctx.cache is None:  # the route's deployment is not cached
        _shape(stages, ctx, body, *late)
        late = None
    return route, late


def _shape(
    stages: Stages, ctx: RequestContext, body: dict[str, Any], template: str | None, tools_json: bytes | None
) -> None:
    """Shape a chat body in place (its result on ``ctx``), in the trace's ``shape`` span."""
    with tracing.child(ctx, "shape") as span:
        stages.shaping.shape(ctx, body, stages.stats, template, tools_json)
        if span is not None and ctx.shape is not None:
            span.set_attributes(
                {
                    "switchyard.template": ctx.shape.template,
                    "switchyard.moved_segments": ctx.shape.moved,
                    "switchyard.stable_prefix_tokens": ctx.shape.stable_prefix_tokens,
                }
            )


def _settle(ctx: RequestContext, plan: CachePlan, route: Route) -> None:
    """The cache plan for the deployment the route tries first (its model is in the key)."""
    policy = ctx.snapshot.policy
    name = route.deployments[0]
    settled = settle(plan, policy.cache, route.tier, name, _model_of(ctx, name))
    if settled is not None:
        ctx.cache = settled
        ctx.response_headers[CACHE_HEADER] = settled.outcome


def _model_of(ctx: RequestContext, name: str) -> str:
    deployment = ctx.snapshot.policy.deployments.get(name)
    return (deployment.model if deployment is not None else None) or name


def _answering_plan(ctx: RequestContext, plan: CachePlan) -> CachePlan | None:
    """The plan under which the answer is stored: the route's first deployment's, or, when
    another one answered (a retry on the next deployment, a fallback tier), the key of that
    deployment's model, as if the route had tried it first: an answer is only ever served
    as the answer of the model that made it. None when that deployment's answers are not
    cached (its tier's or its own setting)."""
    name = ctx.deployment
    if name is None or name == plan.deployment:
        return plan
    policy, route = ctx.snapshot.policy, ctx.route
    tier = route.tier if route is not None else None
    if route is not None and name not in route.deployments and tier is not None:
        # The first fallback tier that has it, as the dispatcher lists its candidates.
        chain = policy.dispatch.fallback.get(tier, ())
        tier = next((t for t in chain if any(m.deployment == name for m in policy.tiers.get(t, ()))), tier)
    return settle(plan, policy.cache, tier, name, _model_of(ctx, name))


async def _lookup(stages: Stages, ctx: RequestContext, plan: CachePlan) -> Entry | None:
    """The entry that answers this request, marked as its answer; None on a miss."""
    cache = stages.cache
    assert cache is not None
    entry = await cache.lookup(plan)
    if entry is not None:
        hit(ctx, plan, entry, plan.key)
        return entry
    semantic = ctx.snapshot.policy.cache.semantic
    if plan.group and semantic.enabled:
        found = await cache.nearest(plan, semantic.threshold)
        if found is not None:
            entry, similarity, key = found
            hit(ctx, plan, entry, key, similarity)
            return entry
    return None


def _template(ctx: RequestContext) -> str | None:
    return ctx.shape.template if ctx.shape is not None else None


def _keep_unary(
    stages: Stages, ctx: RequestContext, plan: CachePlan, body: dict[str, Any], result: UnaryResult
) -> None:
    """Store a non-stream answer that may be kept; the header says whether it was."""
    if stages.cache is None or not plan.key or ctx.escalated is not None:
        return
    answering = _answering_plan(ctx, plan)
    if answering is None:
        return
    plan, raw, answer = answering, result.body, result.obj
    if answer is None:  # the provider did not parse it (a translated answer)
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
    if not isinstance(answer, dict):
        return
    if keep_answer(stages.cache, plan, ctx, body, answer, raw, ctx.snapshot.policy.cache, _template(ctx)):
        plan.outcome = "store"
        ctx.response_headers[CACHE_HEADER] = "store"


async def _admit(stages: Stages, ctx: RequestContext) -> None:
    """Take this request from its key's rate limits and budget (429 when over)."""
    key = ctx.key
    if key is None or not key.limited:
        return
    admission = await stages.limiter.admit(key)
    ctx.response_headers.update(admission.headers)


def _set_route(ctx: RequestContext, route: Route) -> None:
    ctx.tier = route.tier
    ctx.route_reason = route.header()
