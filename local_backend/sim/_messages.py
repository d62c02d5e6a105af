"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``).

The same models, latency profiles, admission queue and fault injection as the OpenAI
endpoints, in Anthropic's wire format: ``x-api-key`` auth, ``max_tokens`` required,
errors as ``{"type": "error", "error": {"type", "message"}}`` (``error=529`` is an
``overloaded_error``), streams as ``message_start`` / ``content_block_*`` /
``message_delta`` / ``message_stop`` events, and the explicit-breakpoint prompt cache of
:mod:`local_backend.sim._messages_cache`.

The answer: a call of the forced tool (``tool_choice`` ``any`` or ``tool``), or of the
first tool when tools are offered and the last turn is not a tool result; else text of
the profile's length, cut by ``max_tokens`` or a stop sequence.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from local_backend.sim._faults import FaultPlan
from local_backend.sim._messages_cache import MessagesCache, breakpoint_problem, prompt_bytes
from local_backend.sim._request import (
    JSON_TYPE,
    Call,
    SimError,
    abort,
    dumps,
    fault_plan,
    forever,
    read_json,
    reject,
    require_model,
    sleep_until,
)
from local_backend.sim._tokens import BYTES_PER_TOKEN, answer_text, natural_length, prompt_seed, token_count

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class AnthropicSimError(SimError):
    """A :class:`SimError` answered in Anthropic's error shape."""

    def response(self) -> web.Response:
        kind = _ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        message = "Overloaded" if self.status == 529 else self.message
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return web.Response(
            status=self.status, body=dumps(body), content_type=JSON_TYPE, headers=self.headers
        )


def _anthropic(exc: SimError) -> AnthropicSimError:
    if exc.status == 400 and exc.code == "context_length_exceeded":
        exc.message = "prompt is too long: " + exc.message
    return AnthropicSimError(exc.status, exc.message, headers=exc.headers, outcome=exc.outcome)


def _bad(message: str) -> AnthropicSimError:
    return AnthropicSimError(400, message)


def _check_auth(call: Call) -> None:
    key = call.state.config.require_api_key
    if key is None:
        return
    headers = call.request.headers
    given = headers.get("x-api-key") or headers.get("Authorization") or ""
    if given.removeprefix("Bearer ").strip() != key:
        raise AnthropicSimError(401, "invalid x-api-key")


def _check(body: dict[str, Any], count_only: bool) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
    if count_only:
        return
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _bad("max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens: Input should be a positive integer")
    problem = breakpoint_problem(body)
    if problem is not None:
        raise _bad(problem)


def _cache(call: Call, model: str) -> MessagesCache:
    caches = call.state.messages_caches
    found = caches.get(model)
    if found is None:
        found = caches[model] = MessagesCache()
    return found


def _tool_to_call(body: dict[str, Any]) -> str | None:
    tools = [t for t in body.get("tools") or () if isinstance(t, dict) and isinstance(t.get("name"), str)]
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not tools or kind == "none":
        return None
    if kind == "tool":
        return str(choice.get("name"))
    if kind == "any":
        return str(tools[0]["name"])
    last = body["messages"][-1].get("content")
    answered = isinstance(last, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last
    )
    return None if answered else str(tools[0]["name"])


def _answer(
    body: dict[str, Any], seed: int, natural: int, plan: FaultPlan
) -> tuple[dict[str, Any], int, str, str | None]:
    """The content block, its output tokens, the stop reason and the stop sequence that
    ended the text (None when none did)."""
    tool = _tool_to_call(body)
    if tool is not None:
        block = {"type": "tool_use", "id": f"toolu_{seed:08x}", "name": tool, "input": {}}
        return block, token_count(tool.encode() + b"{}"), "tool_use", None
    tokens, reason = (0, "end_turn") if plan.empty else (natural, "end_turn")
    if plan.length_tokens is not None and plan.length_tokens < tokens:
        tokens, reason = plan.length_tokens, "max_tokens"
    if body["max_tokens"] < tokens:
        tokens, reason = body["max_tokens"], "max_tokens"
    text = answer_text(seed, tokens * BYTES_PER_TOKEN)
    # The stop sequence found first ends the text; the answer names it (``stop_sequence``).
    found = [(text.find(s), s) for s in body.get("stop_sequences") or () if isinstance(s, str) and s]
    hits = [(cut, stop) for cut, stop in found if cut >= 0]
    if hits:
        cut, stop = min(hits)
        return {"type": "text", "text": text[:cut]}, token_count(text[:cut].encode()), "stop_sequence", stop
    return {"type": "text", "text": text}, token_count(text.encode()), reason, None


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **payload}) + b"\n\n"


async def messages(call: Call) -> web.StreamResponse:
    """``POST /v1/messages``."""
    try:
        return await _messages(call)
    except AnthropicSimError:
        raise
    except SimError as exc:
        raise _anthropic(exc) from None


async def count_tokens(call: Call) -> web.StreamResponse:
    """``POST /v1/messages/count_tokens``: the prompt's tokens, without generating."""
    try:
        _check_auth(call)
        body = await read_json(call)
        _check(body, count_only=True)
        require_model(call, body)
    except AnthropicSimError:
        raise
    except SimError as exc:
        raise _anthropic(exc) from None
    tokens = max(1, token_count(prompt_bytes(body)))
    call.record["status"] = 200
    call.state.stats.finish(call.record, "completed")
    return web.Response(body=dumps({"input_tokens": tokens}), content_type=JSON_TYPE)


async def _messages(call: Call) -> web.StreamResponse:
    _check_auth(call)
    body = await read_json(call)
    _check(body, count_only=False)
    model, profile = require_model(call, body)
    plan = fault_plan(call, model, generation=True)
    state = call.state
    loop = asyncio.get_running_loop()
    arrival = loop.time()
    cache = _cache(call, model).lookup_and_write(body, arrival)
    call.record["prompt_tokens"] = cache.total
    call.record["cached_tokens"] = cache.read
    await reject(plan, cache.total, "messages")
    seed = prompt_seed(prompt_bytes(body))
    block, output_tokens, stop_reason, stop_sequence = _answer(
        body, seed, natural_length(seed, profile.output_tokens), plan
    )
    metrics = state.metrics_for(model)
    metrics.prompt_tokens += cache.total
    metrics.cache_queries += cache.total
    metrics.cache_hits += cache.read
    admission = state.admission_for(model)
    await admission.acquire()
    try:
        admitted = loop.time()
        ttft_s = state.jittered_s(profile.ttft_ms, profile.jitter_ms)
        uncached = cache.total - cache.read
        ttft_s += (profile.prefill_ms_per_1k_tokens * uncached / 1000.0 + plan.slow_first_token_ms) / 1000.0
        first_at = admitted + ttft_s
        metrics.queue.observe(admitted - arrival)
        metrics.ttft.observe(first_at - arrival)
        itl_s = profile.itl_ms / 1000.0
        message = {
            "id": state.new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": cache.usage(output_tokens),
        }
        if body.get("stream") is True:
            response = await _stream(call, message, plan, first_at, itl_s)
        else:
            await sleep_until(loop, first_at + itl_s * max(0, output_tokens - 1))
            response = web.Response(body=dumps(message), content_type=JSON_TYPE)
    finally:
        admission.release()
    metrics.generation_tokens += output_tokens
    metrics.finished[stop_reason] = metrics.finished.get(stop_reason, 0) + 1
    metrics.e2e.observe(loop.time() - arrival)
    call.record["completion_tokens"] = output_tokens
    call.record["status"] = 200
    state.stats.finish(call.record, plan.outcome)
    return response


def _pieces(block: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    if block["type"] == "tool_use":
        return [{"type": "input_json_delta", "partial_json": "{}"}]
    text = block["text"]
    return [
        {"type": "text_delta", "text": text[i : i + chunk_chars]} for i in range(0, len(text), chunk_chars)
    ]


async def _stream(
    call: Call, message: dict[str, Any], plan: FaultPlan, first_at: float, itl_s: float
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    response = call.response = web.StreamResponse(headers=_SSE_HEADERS)
    await response.prepare(call.request)
    await sleep_until(loop, first_at)
    block = message["content"][0]
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    empty_block = {**block, "input": {}} if block["type"] == "tool_use" else {"type": "text", "text": ""}
    await response.write(
        _event("message_start", {"message": start})
        + _event("content_block_start", {"index": 0, "content_block": empty_block})
        + _event("ping", {})
    )
    chunk_tokens = call.state.config.chunk_tokens
    shift_s = 0.0
    for sent, delta in enumerate(_pieces(block, chunk_tokens * BYTES_PER_TOKEN)):
        if plan.reset_after is not None and sent >= plan.reset_after:
            raise abort(call)
        if plan.stall_after is not None and sent == plan.stall_after:
            if plan.stall_ms is None:
                await forever()
            else:
                await asyncio.sleep(plan.stall_ms / 1000.0)
                shift_s += plan.stall_ms / 1000.0
        if plan.malformed_after is not None and sent == plan.malformed_after:
            await response.write(b"event: content_block_delta\ndata: {not json\n\n")
            await response.write_eof()
            return response
        await sleep_until(loop, first_at + shift_s + itl_s * sent * chunk_tokens)
        await response.write(_event("content_block_delta", {"index": 0, "delta": delta}))
    await response.write(
        _event("content_block_stop", {"index": 0})
        + _event(
            "message_delta",
            {
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        + _event("message_stop", {})
    )
    await response.write_eof()
    return response
