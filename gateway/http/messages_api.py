"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API.

The endpoint is a dialect, not a second pipeline: the body is translated to a chat
completion at the edge (:mod:`gateway.dialects.anthropic.inbound`) and runs the same
stages as ``/v1/chat/completions`` (shaping, routing, limits, dispatch, cost, stats,
metrics, traces; the context keeps ``/v1/messages`` as its endpoint label). An
Anthropic deployment gets it back as a Messages request, with the client's
``cache_control`` marks and the gateway's breakpoints; an OpenAI-compatible one gets
the chat completion. The answer, stream or not, goes back in Anthropic's format, and
errors (set by :func:`gateway.http.responses.error_response` for this path) in
Anthropic's error JSON.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.api.protocol import ChatCompletionRequest
from gateway.cache.service import AnswerStream
from gateway.context import RequestContext
from gateway.dialects.anthropic.inbound import estimate_tokens, to_chat_request, to_message
from gateway.dialects.anthropic.response import MessagesStreamScanner
from gateway.dialects.anthropic.sse import ChunksToEvents
from gateway.dispatch.fanout import timeout_override
from gateway.errors import ModelNotFoundError, SwitchyardError
from gateway.http.responses import json_response, read_json, route_headers
from gateway.http.state import CTX, STAGES
from gateway.http.streaming import forward_stream
from gateway.pipeline import open_stream, run_unary
from gateway.routing.resolve import model_names

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
ENDPOINT = "/chat/completions"
"""What the request runs as upstream of the edge: a chat completion."""


async def messages(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages``."""
    ctx = request[CTX]
    body = await read_json(request)
    chat = to_chat_request(body)
    ctx.timeout_override = timeout_override(request.headers.get("x-switchyard-timeout"))
    stages = request.app[STAGES]
    if chat.get("stream") is True:
        opened = await open_stream(stages, ctx, ChatCompletionRequest, ENDPOINT, chat, request.headers)
        return await _forward(request, ctx, opened, ChunksToEvents(body["model"]))
    result = await run_unary(stages, ctx, ChatCompletionRequest, ENDPOINT, chat, request.headers)
    answer = to_message(orjson.loads(result.body), body["model"])
    return web.Response(
        body=orjson.dumps(answer), headers=route_headers(ctx), content_type="application/json"
    )


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the gateway's estimate for a model it serves."""
    ctx = request[CTX]
    body = await read_json(request)
    model = body.get("model")
    if not isinstance(model, str) or model not in model_names(ctx.snapshot.policy):
        raise ModelNotFoundError(str(model))
    if ctx.key is not None and not ctx.key.allows(model):
        raise ModelNotFoundError(model)
    return json_response({"input_tokens": estimate_tokens(body)})


async def _forward(
    request: web.Request, ctx: RequestContext, opened: AnswerStream, events: ChunksToEvents
) -> web.StreamResponse:
    """Write the opened chat stream to the client as Anthropic events, until its end."""
    if isinstance(opened.scanner, MessagesStreamScanner):
        # An Anthropic upstream told the input tokens at its start: so does message_start.
        events.start_usage = opened.scanner.start_usage
    return await forward_stream(
        request,
        ctx,
        opened,
        error_event=lambda exc: events.error_event(exc.message, _kind(exc)),
        translate=events.feed,
        finished=lambda: events.finished,
    )


def _kind(exc: SwitchyardError) -> str:
    if exc.status == 429:
        return "rate_limit_error"
    if exc.status in (503, 529):
        return "overloaded_error"
    if exc.status == 504:
        return "timeout_error"
    return "api_error"
