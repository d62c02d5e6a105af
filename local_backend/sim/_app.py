"""The simulator's aiohttp application: OpenAI endpoints, control API, health and metrics."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.prompt_render import render_chat
from local_backend.sim._canned import Canned, answer
from local_backend.sim._config import SimConfig
from local_backend.sim._faults import FaultRule
from local_backend.sim._generate import generate
from local_backend.sim._messages import count_tokens, messages
from local_backend.sim._request import (
    JSON_TYPE,
    Call,
    Reset,
    SimError,
    check_auth,
    check_messages,
    dumps,
    fault_plan,
    int_param,
    invalid_value,
    prompt_list,
    read_json,
    reject,
    require_model,
    sleep_until,
)
from local_backend.sim._responses import responses
from local_backend.sim._state import SIM_STATE, SimState
from local_backend.sim._stats import render_metrics
from local_backend.sim._tokens import token_count

MAX_BODY_BYTES = 64 * 1024 * 1024

_Impl = Callable[[Call], Awaitable[web.StreamResponse]]


def _api(endpoint: str, impl: _Impl) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Wrap an API endpoint: count it, record it in ``recent``, map errors, notice a client
    that goes away (the handler is cancelled, or a write fails)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[SIM_STATE]
        stats = state.stats
        call = Call(state, request, stats.begin(endpoint, request.headers))
        try:
            try:
                return await impl(call)
            except Canned as canned:  # an answering fault: a made-up broken answer
                return await answer(request, call.record, stats.finish, canned.name)
        except SimError as exc:
            call.record["status"] = exc.status
            stats.finish(call.record, exc.outcome)
            return exc.response()
        except Reset:
            stats.finish(call.record, "reset_mid_stream")
            return call.response or web.Response(status=500)  # never reaches the client
        except ConnectionError:
            stats.finish(call.record, "cancelled")
            return call.response or web.Response(status=500)
        except asyncio.CancelledError:
            stats.finish(call.record, "cancelled")
            raise
        finally:
            stats.in_flight -= 1

    return handler


def _apply_template(call: Call, body: dict[str, Any]) -> None:
    """Refuse what the configured chat template refuses (``--template first``: a system
    message after the first message), as vLLM answers a template that raises: a 400."""
    if call.state.config.template != "first":
        return
    for i, message in enumerate(body["messages"]):
        if i and isinstance(message, dict) and message.get("role") in ("system", "developer"):
            raise SimError(400, "System message must be at the beginning.", param="messages")


async def _chat_completions(call: Call) -> web.StreamResponse:
    check_auth(call)
    body = await read_json(call)
    check_messages(body)
    model, profile = require_model(call, body)
    _apply_template(call, body)
    prompts = [render_chat(body)]
    return await generate(
        call, chat=True, model=model, profile=profile, prompts=prompts, body=body, param="messages"
    )


async def _tokenize(call: Call) -> web.StreamResponse:
    """vLLM's ``POST /tokenize``: ``messages`` (rendered with the chat template, which may
    refuse them) or ``prompt``; answers ``count``, ``max_model_len`` and ``tokens``, generates
    nothing. The tokens are the simulator's (one per 4 bytes), their ids made up."""
    check_auth(call)
    body = await read_json(call)
    if "messages" in body:
        check_messages(body)
        _apply_template(call, body)
        prompt = render_chat(body)
    elif isinstance(body.get("prompt"), str):
        prompt = body["prompt"].encode()
    else:
        raise invalid_value("messages", "either 'messages' or a string 'prompt' is required")
    model = body.get("model")
    if model is not None:
        require_model(call, body)
    count = token_count(prompt)
    tokens = [
        int.from_bytes(prompt[i : i + 4].ljust(4, b"\0"), "little") % 50_000 for i in range(0, len(prompt), 4)
    ]
    return _json({"count": count, "max_model_len": 32_768, "tokens": tokens})


async def _tokenize_handler(request: web.Request) -> web.StreamResponse:
    """``/tokenize`` outside the request statistics (it generates nothing: the counts, the
    ``recent`` list and the faults are the generating endpoints')."""
    try:
        return await _tokenize(Call(request.app[SIM_STATE], request, {}))
    except SimError as error:
        return error.response()


async def _completions(call: Call) -> web.StreamResponse:
    check_auth(call)
    body = await read_json(call)
    prompts = prompt_list(body.get("prompt"), "prompt")
    model, profile = require_model(call, body)
    return await generate(
        call, chat=False, model=model, profile=profile, prompts=prompts, body=body, param="prompt"
    )


def embedding_vector(data: bytes, full_dim: int, dims: int) -> tuple[tuple[float, ...], bytes]:
    """A deterministic unit vector for ``data`` and its little-endian float32 bytes.

    The first ``dims`` of ``full_dim`` hash-derived components, renormalised (as OpenAI's
    ``dimensions`` shortens an embedding), rounded to float32 so that the ``float`` and
    ``base64`` encodings carry the very same numbers.
    """
    ints = struct.unpack(f"<{full_dim}i", hashlib.shake_256(data).digest(4 * full_dim))[:dims]
    norm = math.sqrt(math.fsum(float(x) * x for x in ints)) or 1.0
    packed = struct.pack(f"<{dims}f", *(x / norm for x in ints))
    return struct.unpack(f"<{dims}f", packed), packed


async def _embeddings(call: Call) -> web.StreamResponse:
    check_auth(call)
    body = await read_json(call)
    inputs = prompt_list(body.get("input"), "input")
    if any(not data for data in inputs):
        raise invalid_value("input", "an input must not be empty.")
    model, profile = require_model(call, body)
    dims = int_param(body, "dimensions", 1, profile.embedding_dim) or profile.embedding_dim
    encoding = body.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise invalid_value("encoding_format", "expected 'float' or 'base64'.")
    plan = fault_plan(call, model, generation=False)
    tokens = sum(token_count(data) for data in inputs)
    call.record["prompt_tokens"] = tokens
    await reject(plan, tokens, "input")
    state = call.state
    loop = asyncio.get_running_loop()
    arrival = loop.time()
    admission = state.admission_for(model)
    await admission.acquire()
    try:
        admitted = loop.time()
        latency_s = state.jittered_s(profile.ttft_ms, profile.jitter_ms)
        latency_s += (profile.prefill_ms_per_1k_tokens * tokens / 1000.0 + plan.slow_first_token_ms) / 1000.0
        await sleep_until(loop, admitted + latency_s)
    finally:
        admission.release()
    salt = model.encode() + b"\0"  # each model its own embedding space
    data: list[dict[str, Any]] = []
    for index, item in enumerate(inputs):
        floats, packed = embedding_vector(salt + item, profile.embedding_dim, dims)
        vector: Any = base64.b64encode(packed).decode() if encoding == "base64" else floats
        data.append({"object": "embedding", "index": index, "embedding": vector})
    metrics = state.metrics_for(model)
    metrics.prompt_tokens += tokens
    metrics.queue.observe(admitted - arrival)
    metrics.e2e.observe(loop.time() - arrival)
    metrics.finished["stop"] = metrics.finished.get("stop", 0) + 1
    payload = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    call.record["status"] = 200
    state.stats.finish(call.record, plan.outcome)
    return web.Response(body=dumps(payload), content_type=JSON_TYPE)


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(payload), content_type=JSON_TYPE)


async def _list_models(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    key = state.config.require_api_key
    if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
        return SimError(401, "Incorrect API key provided.", code="invalid_api_key").response()
    data = [
        {"id": name, "object": "model", "created": state.started_at, "owned_by": "switchyard-sim"}
        for name in state.config.models
    ]
    return _json({"object": "list", "data": data})


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    names = list(dict.fromkeys([*state.config.models, *state.metrics]))
    rows = []
    for name in names:
        admission = state.admissions.get(name)
        cache = state.caches.get(name)
        rows.append(
            (
                name,
                state.metrics_for(name),
                admission.running if admission else 0,
                admission.waiting if admission else 0,
                cache.usage if cache else 0.0,
            )
        )
    # The exposition format's own content type, as vLLM (prometheus_client) sends it.
    return web.Response(
        body=render_metrics(rows).encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def _stats(request: web.Request) -> web.StreamResponse:
    return _json(request.app[SIM_STATE].stats.to_dict())


def _fault_list(state: SimState) -> web.Response:
    return _json({"faults": [rule.to_dict() for rule in state.faults.rules]})


async def _get_faults(request: web.Request) -> web.StreamResponse:
    return _fault_list(request.app[SIM_STATE])


async def _add_fault(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    try:
        body = orjson.loads(await request.read())
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        fault = body.get("fault")
        rate = body.get("rate", 1.0)
        count = body.get("count")
        model = body.get("model", "*")
        if not isinstance(fault, str) or not isinstance(model, str):
            raise ValueError("'fault' and 'model' must be strings")
        if not isinstance(rate, int | float) or isinstance(rate, bool):
            raise ValueError("'rate' must be a number")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            raise ValueError("'count' must be an integer or null")
        state.faults.rules.append(FaultRule(model=model, fault=fault, rate=float(rate), count=count))
    except ValueError as exc:  # orjson.JSONDecodeError and FaultSpecError are ValueErrors
        return SimError(400, f"bad fault rule: {exc}").response()
    return _fault_list(state)


async def _clear_faults(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    state.faults.rules.clear()
    return _fault_list(state)


async def _reset(request: web.Request) -> web.StreamResponse:
    request.app[SIM_STATE].reset()
    return _json({"reset": True})


def create_app(config: SimConfig) -> web.Application:
    """The simulator as an aiohttp application.

    Serve it with ``handler_cancellation=True`` (as :func:`~local_backend.sim.serve` and
    aiohttp's test server do): that is how a client that goes away cancels its request and
    is counted ``cancelled``. The state is ``app[SIM_STATE]``.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SIM_STATE] = SimState(config)
    add_get, add_post = app.router.add_get, app.router.add_post
    add_post("/v1/chat/completions", _api("/v1/chat/completions", _chat_completions))
    add_post("/v1/completions", _api("/v1/completions", _completions))
    add_post("/tokenize", _tokenize_handler)
    add_post("/v1/embeddings", _api("/v1/embeddings", _embeddings))
    add_post("/v1/messages", _api("/v1/messages", messages))
    add_post("/v1/messages/count_tokens", _api("/v1/messages/count_tokens", count_tokens))
    add_post("/v1/responses", _api("/v1/responses", responses))
    add_get("/v1/models", _list_models)
    add_get("/health", _health)
    add_get("/metrics", _metrics)
    add_get("/sim/stats", _stats)
    add_get("/sim/faults", _get_faults)
    add_post("/sim/faults", _add_fault)
    app.router.add_delete("/sim/faults", _clear_faults)
    add_post("/sim/reset", _reset)
    return app
