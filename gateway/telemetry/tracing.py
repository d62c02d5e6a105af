"""OpenTelemetry tracing: one span per API request, children for shaping, routing and each
upstream attempt; exported over OTLP/HTTP as the standard ``OTEL_*`` variables say.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set
(or ``OTEL_TRACES_EXPORTER=otlp|console``); ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off. When off, a request's context carries no
tracer and every hook below is one ``is None`` test: nothing is created, nothing exported.

The request span continues an incoming W3C ``traceparent``; each attempt span's context is
sent upstream in the attempt's own ``traceparent``. Attributes follow the OpenTelemetry
GenAI semantic conventions (``gen_ai.*``) plus ``switchyard.*``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from gateway.context import RequestContext

DEFAULT_SERVICE_NAME = "switchyard-gateway"
_PROPAGATOR = TraceContextTextMapPropagator()
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables in ``env`` (default ``os.environ``) ask for tracing."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    if exporter in ("otlp", "console"):
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """A tracer provider of the gateway's own (the global one is left alone)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("switchyard")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tracing | None:
        """Tracing as the ``OTEL_*`` variables configure it, or None when it is off.

        The OTLP/HTTP exporter reads its endpoint, headers, timeout and compression from
        ``OTEL_EXPORTER_OTLP[_TRACES]_*``; the batch processor ``OTEL_BSP_*``; the sampler
        ``OTEL_TRACES_SAMPLER[_ARG]``; the resource ``OTEL_SERVICE_NAME`` and
        ``OTEL_RESOURCE_ATTRIBUTES``.
        """
        env = os.environ if env is None else env
        if not enabled(env):
            return None
        exporter: SpanExporter
        if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        name = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def start_request(self, ctx: RequestContext, method: str, headers: Mapping[str, str]) -> object:
        """Open the request span (continuing ``traceparent`` if one came in) and make it
        current; returns the token :func:`end_request` needs."""
        parent = _PROPAGATOR.extract(headers)
        span = self.tracer.start_span(
            f"{method} {ctx.endpoint}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": ctx.endpoint,
                "switchyard.request_id": ctx.request_id,
            },
        )
        ctx.tracer = self.tracer
        ctx.span = span
        return otel_context.attach(trace.set_span_in_context(span, parent))

    def shutdown(self) -> None:
        """Export what is queued, then stop."""
        self.provider.shutdown()


def end_request(ctx: RequestContext, token: object) -> None:
    """Set the request span's final attributes, end it and restore the previous context."""
    span: Span | None = ctx.span
    if span is None:
        return
    try:
        _finish_attributes(span, ctx)
    finally:
        span.end()
        otel_context.detach(token)  # type: ignore[arg-type]


def _finish_attributes(span: Span, ctx: RequestContext) -> None:
    operation = _OPERATIONS.get(ctx.endpoint, "chat")
    if ctx.requested_model:
        span.update_name(f"{operation} {ctx.requested_model}")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "http.response.status_code": ctx.status,
        "switchyard.stream": ctx.stream,
        "switchyard.attempts": ctx.attempts,
    }
    if ctx.requested_model:
        attributes["gen_ai.request.model"] = ctx.requested_model
    if ctx.deployment is not None:
        attributes["switchyard.deployment"] = ctx.deployment
        found = ctx.snapshot.policy.deployments.get(ctx.deployment)
        if found is not None:
            attributes["gen_ai.provider.name"] = found.provider
            attributes["gen_ai.response.model"] = found.model or ctx.deployment
    if ctx.tier is not None:
        attributes["switchyard.tier"] = ctx.tier
    if ctx.route_reason is not None:
        attributes["switchyard.route_reason"] = ctx.route_reason
    if ctx.hedged:
        attributes["switchyard.hedged"] = True
    if ctx.fallback_tier is not None:
        attributes["switchyard.fallback_tier"] = ctx.fallback_tier
    if ctx.escalated is not None:
        attributes["switchyard.escalated"] = ctx.escalated
    prompt = ctx.usage_int("prompt_tokens")
    if prompt is not None:
        attributes["gen_ai.usage.input_tokens"] = prompt
    completion = ctx.usage_int("completion_tokens")
    if completion is not None:
        attributes["gen_ai.usage.output_tokens"] = completion
    cached = ctx.cached_tokens
    if cached is not None:
        attributes["switchyard.cached_tokens"] = cached
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    if ctx.shape is not None:
        attributes["switchyard.stable_prefix_tokens"] = ctx.shape.stable_prefix_tokens
        attributes["switchyard.template"] = ctx.shape.template
    if ctx.prefix_hit_tokens is not None:
        attributes["switchyard.expected_prefix_hit_tokens"] = ctx.prefix_hit_tokens
    ttft = ctx.ttft_ms
    if ttft is not None:
        attributes["switchyard.ttft_ms"] = round(ttft, 3)
    if ctx.error_code:
        attributes["error.type"] = ctx.error_code
    if ctx.error_detail:
        attributes["switchyard.error.detail"] = ctx.error_detail
    span.set_attributes(attributes)
    if ctx.status >= 500 or (ctx.error_code and ctx.status < 400):
        # A 5xx, or a stream that broke after its 200 went out.
        span.set_status(Status(StatusCode.ERROR, ctx.error_code or str(ctx.status)))


def request_attributes(ctx: RequestContext, body: Mapping[str, Any]) -> None:
    """The ``gen_ai.request.*`` parameters of the client's body."""
    span: Span | None = ctx.span
    if span is None:
        return
    for name, key in (
        ("gen_ai.request.max_tokens", "max_tokens"),
        ("gen_ai.request.max_tokens", "max_completion_tokens"),
        ("gen_ai.request.temperature", "temperature"),
        ("gen_ai.request.top_p", "top_p"),
    ):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            span.set_attribute(name, value)


_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def child(
    ctx: RequestContext, name: str, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current span, made current (nothing at all when tracing is off)."""
    tracer: Tracer | None = ctx.tracer
    if tracer is None:
        return _NOTHING
    return tracer.start_as_current_span(name, attributes=attributes, record_exception=False)


@contextlib.contextmanager
def attempt_span(
    ctx: RequestContext, deployment: str, tier: str | None, hedge: bool, fallback: bool
) -> Iterator[Span | None]:
    """The span of one upstream attempt; its ``switchyard.outcome`` is ``ok``, the failure's
    reason, or ``cancelled`` (a hedge that lost, or a client that left)."""
    tracer: Tracer | None = ctx.tracer
    if tracer is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "switchyard.deployment": deployment,
        "switchyard.attempt.number": ctx.attempts,
        "switchyard.attempt.retry": ctx.retries,
        "switchyard.attempt.hedge": hedge,
        "switchyard.attempt.fallback": fallback,
    }
    if tier is not None:
        attributes["switchyard.tier"] = tier
    with tracer.start_as_current_span(
        f"attempt {deployment}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def attempt_outcome(span: Span | None, outcome: str, status: int | None = None) -> None:
    """Record how an attempt ended."""
    if span is None:
        return
    span.set_attribute("switchyard.outcome", outcome)
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if outcome not in ("ok", "cancelled"):
        span.set_status(Status(StatusCode.ERROR, outcome))


def first_token(ctx: RequestContext) -> None:
    """The ``first_token`` event on the request span."""
    span: Span | None = ctx.span
    if span is not None:
        span.add_event("first_token", {"switchyard.ttft_ms": round(ctx.ttft_ms or 0.0, 3)})


def inject(ctx: RequestContext, headers: MutableMapping[str, str]) -> None:
    """Add the current (attempt) span's ``traceparent`` to an upstream request's headers."""
    if ctx.span is not None:
        _PROPAGATOR.inject(headers)


def traceparent(ctx: RequestContext) -> str | None:
    """The request span's ``traceparent``, for the response headers."""
    span: Span | None = ctx.span
    if span is None:
        return None
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
