"""The Responses API endpoints: ``POST /v1/responses`` (stream or not) through the one
pipeline, and the stored responses (``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``)."""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from gateway.context import RequestContext
from gateway.dialects.responses.native import NativeResponsesScanner
from gateway.dialects.responses.providers import ResponsesRequestState
from gateway.dialects.responses.request import input_items, with_ids
from gateway.dialects.responses.stream import ChatToResponsesScanner
from gateway.dialects.responses.wire import ResponsesRequest
from gateway.dispatch.fanout import timeout_override
from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.http.responses import json_response, read_json, route_headers
from gateway.http.state import CTX, REDIS, STAGES
from gateway.http.streaming import forward_stream
from gateway.pipeline import open_stream, run_unary
from gateway.store.responses import ResponseStore, StoredResponse

_log = structlog.get_logger("switchyard.responses")


def _store(request: web.Request) -> ResponseStore:
    return ResponseStore(request.app[REDIS])


async def create_response(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses``."""
    ctx = request[CTX]
    body = await read_json(request)
    ctx.timeout_override = timeout_override(request.headers.get("x-switchyard-timeout"))
    stages = request.app[STAGES]
    _check_input(body, stages.settings.max_messages)
    store = _store(request)
    previous_id = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous_id is not None:
        if not isinstance(previous_id, str):
            raise InvalidRequestError(
                "Invalid type for 'previous_response_id': expected a string.",
                param="previous_response_id",
                code="invalid_type",
            )
        history = (await store.load(ctx.key_id, previous_id, "previous_response_id")).conversation
    state = ResponsesRequestState(dict(body), history)
    keep = body.get("store", True) is not False

    async def save(response: dict[str, Any] | None) -> None:
        if not keep or response is None or "id" not in response:
            return
        # The body was validated by the pipeline by now: its items are dicts.
        items = with_ids(input_items(body))
        stored = StoredResponse(response, items, [*history, *items, *response.get("output", [])])
        try:
            await store.save(ctx.key_id, stored, ctx.snapshot.policy.responses.store_ttl_s)
        except SwitchyardError as exc:
            # The answer is already paid for: give it, say it was not stored.
            ctx.response_headers["x-switchyard-stored"] = "false"
            _log.warning("response_not_stored", request_id=ctx.request_id, error=exc.message)

    if body.get("stream") is True:
        opened = await open_stream(stages, ctx, ResponsesRequest, "/responses", body, request.headers, state)
        scanner = opened.scanner
        assert isinstance(scanner, ChatToResponsesScanner | NativeResponsesScanner)

        async def before_end() -> None:
            await save(scanner.final_response)

        return await forward_stream(request, ctx, opened, scanner.error_event, before_end)
    result = await run_unary(stages, ctx, ResponsesRequest, "/responses", body, request.headers, state)
    if keep:
        try:
            answer = orjson.loads(result.body)
        except orjson.JSONDecodeError:
            answer = None
        await save(answer if isinstance(answer, dict) else None)
    return web.Response(body=result.body, headers=route_headers(ctx), content_type="application/json")


def _check_input(body: dict[str, Any], max_items: int) -> None:
    """``input`` is required (unless a stored ``prompt`` or ``conversation`` on OpenAI's side
    supplies it) and named as the Responses API names it: the chat messages it is translated
    to are the gateway's business, not the client's. The chat endpoint's message limit
    applies to input items (they become messages)."""
    items = body.get("input")
    if items is None and body.get("prompt") is None and body.get("conversation") is None:
        raise InvalidRequestError(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    if items == [] and body.get("previous_response_id") is None:
        raise InvalidRequestError(
            "Invalid 'input': empty array. Expected at least one input item.",
            param="input",
            code="empty_array",
        )
    if isinstance(items, list) and len(items) > max_items:
        raise InvalidRequestError(
            f"Invalid 'input': array too long. Expected an array with at most {max_items} "
            f"elements, but got {len(items)}.",
            param="input",
            code="array_above_max_length",
        )


def _owner(ctx: RequestContext) -> str | None:
    return ctx.key_id


async def get_response(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}``: a stored response of the caller's key."""
    ctx = request[CTX]
    stored = await _store(request).load(_owner(ctx), request.match_info["response_id"])
    return json_response(stored.response)


async def delete_response(request: web.Request) -> web.StreamResponse:
    """``DELETE /v1/responses/{id}``."""
    ctx = request[CTX]
    response_id = request.match_info["response_id"]
    await _store(request).delete(_owner(ctx), response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}/input_items``: the input items of a stored response, paged
    as OpenAI pages them (``order`` desc by default, ``limit`` 1-100, ``after``)."""
    ctx = request[CTX]
    stored = await _store(request).load(_owner(ctx), request.match_info["response_id"])
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("Invalid 'order': expected 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise InvalidRequestError("Invalid 'limit': expected an integer.", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequestError("Invalid 'limit': expected 1 to 100.", param="limit")
    items = list(stored.input_items)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }
    )
