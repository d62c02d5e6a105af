"""The answers every handler builds: JSON bodies, OpenAI's error JSON with the routing
headers, the request body read as a JSON object, and the drain's answer."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gateway.context import RequestContext
from gateway.dialects.anthropic.inbound import error_object
from gateway.errors import InvalidRequestError, SwitchyardError, UpstreamUnavailableError
from gateway.http.state import DRAINING
from gateway.telemetry import tracing


def json_response(obj: Any, status: int = 200) -> web.Response:
    """``obj`` as a JSON answer."""
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(exc: SwitchyardError, ctx: RequestContext | None = None) -> web.Response:
    """OpenAI's error JSON for ``exc`` (Anthropic's on ``/v1/messages``), with the request's
    routing headers when it has a context."""
    # The gateway has already retried what was worth retrying: the SDKs must not add a
    # second layer of retries on top (the official openai SDK obeys this header).
    headers = {**exc.headers, "x-should-retry": "false"}
    body = exc.to_json()
    if ctx is not None:
        headers.update(route_headers(ctx))
        if ctx.endpoint.startswith("/v1/messages"):
            # Anthropic's Messages API answers errors in its own JSON.
            body = orjson.dumps(error_object(exc))
    return web.Response(body=body, status=exc.status, headers=headers, content_type="application/json")


def route_headers(ctx: RequestContext) -> dict[str, str]:
    """The ``x-switchyard-*`` headers that say how a request was routed and answered."""
    headers = {"x-request-id": ctx.request_id}
    if ctx.endpoint.startswith("/v1/messages"):
        # Anthropic's header: the anthropic SDKs read it into a response's _request_id.
        headers["request-id"] = ctx.request_id
    if ctx.deployment is not None:
        headers["x-switchyard-model"] = ctx.deployment
        headers["x-switchyard-attempts"] = str(ctx.attempts)
    if ctx.route_reason is not None:
        headers["x-switchyard-route"] = ctx.route_reason
    if ctx.fallback_tier is not None:
        headers["x-switchyard-fallback"] = ctx.fallback_tier
    if ctx.hedged:
        headers["x-switchyard-hedged"] = "true"
    if ctx.escalated is not None:
        headers["x-switchyard-escalated"] = ctx.escalated
    if ctx.shape is not None:
        headers["x-switchyard-shaping"] = ctx.shape.header()
    if ctx.prefix_hit_tokens is not None:
        headers["x-switchyard-prefix-hit"] = str(ctx.prefix_hit_tokens)
    if ctx.span is not None:
        parent = tracing.traceparent(ctx)
        if parent is not None:
            headers["traceparent"] = parent
    if ctx.response_headers:
        headers.update(ctx.response_headers)
    return headers


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; 400 when it is not one."""
    try:
        raw = await request.read()
    except RequestPayloadError:
        encoding = request.headers.get("Content-Encoding", "")
        raise InvalidRequestError(
            f"The request body could not be read (Content-Encoding {encoding!r} does not match it).",
            code="invalid_body",
        ) from None
    try:
        body = orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError):
        raise InvalidRequestError(
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    return body


def shutdown_error() -> SwitchyardError:
    """What a request still running at the drain deadline answers."""
    return UpstreamUnavailableError(
        "The gateway is shutting down and its drain deadline passed; retry the request.",
        code="gateway_shutdown",
    )


def cancelled_by_drain(app: web.Application) -> bool:
    """Whether the current task's cancellation came from the drain deadline (then the request
    still answers) rather than from a client that went away."""
    task = asyncio.current_task()
    return app[DRAINING].is_set() and task is not None and task.uncancel() == 0
