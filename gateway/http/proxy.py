"""The ``/v1`` endpoints: chat completions, completions and embeddings through the pipeline
(stream or not), fan-out, and the model list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel

from gateway.api.protocol import ChatCompletionRequest
from gateway.config import PolicySnapshot
from gateway.context import RequestContext
from gateway.dispatch.fanout import parse_fanout, run_fanout, timeout_override
from gateway.errors import InvalidRequestError, ModelNotFoundError, SwitchyardError
from gateway.http.middleware import Handler
from gateway.http.redact import for_client
from gateway.http.responses import json_response, read_json, route_headers
from gateway.http.state import CTX, STAGES
from gateway.http.streaming import forward_stream
from gateway.pipeline import finish, open_stream, run_unary
from gateway.routing.resolve import model_names


def proxy(endpoint: str, schema: type[BaseModel], streamable: bool) -> Handler:
    """The handler of an OpenAI endpoint: ``endpoint`` upstream, bodies checked against ``schema``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        ctx = request[CTX]
        body = await read_json(request)
        ctx.timeout_override = timeout_override(request.headers.get("x-switchyard-timeout"))
        stages = request.app[STAGES]
        if streamable and body.get("stream") is True:
            opened = await open_stream(stages, ctx, schema, endpoint, body, request.headers)
            return await forward_stream(request, ctx, opened)
        result = await run_unary(stages, ctx, schema, endpoint, body, request.headers)
        return web.Response(
            body=result.body, headers=route_headers(ctx), content_type=result.content_type.split(";")[0]
        )

    return handle


async def fanout(request: web.Request) -> web.Response:
    """``POST /v1/fanout``: chat completions run concurrently; results in input order."""
    parent = request[CTX]
    spec = parse_fanout(await read_json(request))
    override = timeout_override(request.headers.get("x-switchyard-timeout"))
    stages = request.app[STAGES]

    async def one(index: int, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        ctx = RequestContext(
            request_id=f"{parent.request_id}.{index}",
            endpoint="/v1/chat/completions",
            snapshot=parent.snapshot,
            key_id=parent.key_id,
            key=parent.key,
            timeout_override=override,
            # Items are traced inside the fan-out's span (their attempts are its children).
            tracer=parent.tracer,
            span=parent.span,
        )
        try:
            if body.get("stream") is True:
                raise InvalidRequestError("Fan-out items cannot stream.", param="stream")
            result = await run_unary(
                stages, ctx, ChatCompletionRequest, "/chat/completions", body, request.headers
            )
        except SwitchyardError as exc:
            ctx.status = exc.status
            return exc.status, route_headers(ctx), for_client(request.app, ctx, exc).to_json()
        except asyncio.CancelledError:
            ctx.status, ctx.error_code = 504, "fanout_item_timeout"
            raise
        finally:
            if not ctx.status:
                ctx.status = 200
            ctx.finished_at = time.perf_counter()
            finish(stages, ctx)
        return 200, route_headers(ctx), result.body

    results = await run_fanout(spec, one)
    return web.Response(body=results, content_type="application/json", headers=route_headers(parent))


def _models_body(snapshot: PolicySnapshot, ctx: RequestContext) -> bytes:
    created = int(snapshot.loaded_at)
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "switchyard"}
                for name in model_names(snapshot.policy)
                if ctx.key is None or ctx.key.allows(name)
            ],
        }
    )


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: every name the policy answers to (that the key may use)."""
    ctx = request[CTX]
    return web.Response(body=_models_body(ctx.snapshot, ctx), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``."""
    ctx = request[CTX]
    name = request.match_info["model"]
    if name not in model_names(ctx.snapshot.policy) or (ctx.key is not None and not ctx.key.allows(name)):
        raise ModelNotFoundError(name)
    body = {"id": name, "object": "model", "created": int(ctx.snapshot.loaded_at), "owned_by": "switchyard"}
    return json_response(body)
