"""The simulator's ``/v1/responses``: OpenAI's Responses API served natively, so the
gateway's pass-through path is tested and benchmarked without a network.

The answer is the chat generation's (same timeline, prefix cache, faults and usage),
written in the Responses API's format: a whole ``response`` object, or its typed events
as the chat chunks are due. ``previous_response_id`` is not kept here: the gateway sends
the conversation as input items.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from gateway.dialects.responses.answer import from_chat
from gateway.dialects.responses.request import to_chat
from gateway.errors import SwitchyardError
from gateway.prompt_render import render_chat
from local_backend.sim._answers import make_choice
from local_backend.sim._generate import _MALFORMED, _SSE_HEADERS, _Generation, chat_output
from local_backend.sim._request import (
    JSON_TYPE,
    Call,
    SimError,
    check_auth,
    dumps,
    fault_plan,
    int_param,
    max_tokens_param,
    read_json,
    reject,
    require_model,
)
from local_backend.sim._responses_events import EventWriter
from local_backend.sim._tokens import choice_seed, prompt_seed


def _chat_body(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("previous_response_id") is not None:
        raise SimError(
            400,
            "The simulator keeps no responses: send the conversation as input items.",
            param="previous_response_id",
        )
    try:
        chat = to_chat(body, [], "sim")
    except SwitchyardError as exc:
        raise SimError(400, exc.message, param=exc.param) from None
    if not chat["messages"]:
        raise SimError(400, "Missing required parameter: 'input'.", param="input")
    return chat


async def responses(call: Call) -> web.StreamResponse:
    """``POST /v1/responses``."""
    check_auth(call)
    body = await read_json(call)
    chat = _chat_body(body)
    model, profile = require_model(call, body)
    prompts = [render_chat(chat)]
    max_tokens = max_tokens_param(chat)
    plan = fault_plan(call, model, generation=True)
    gen = _Generation(call, True, model, profile, prompts, b"", plan)
    call.record["prompt_tokens"] = gen.prompt_tokens
    await reject(plan, gen.prompt_tokens, "input")
    int_param(body, "max_output_tokens", 1)
    gen.choices.append(
        make_choice(0, choice_seed(prompt_seed(prompts[0]), 0), profile, max_tokens, chat_output(chat), plan)
    )
    stream = body.get("stream") is True
    if stream:
        real = web.StreamResponse(headers=_SSE_HEADERS)
        await real.prepare(call.request)
        call.record["status"] = 200
        call.response = real
    admission = call.state.admission_for(model)
    await admission.acquire()
    try:
        gen.prefill()
        gen.schedule(gen.loop.time())
        if stream:
            # The generation writes to call.response: the translator, for the length of the
            # stream only. A fault that ends it (reset_mid_stream) makes the endpoint's wrapper
            # return call.response to aiohttp, which must then be the real response again.
            call.response = EventWriter(real, body, model, _MALFORMED)  # type: ignore[assignment]
            try:
                await gen.stream(include_usage=True)
            finally:
                call.response = real
            return real
        answer = await gen.unary()
    finally:
        admission.release()
    try:
        completion = orjson.loads(answer.body)  # type: ignore[arg-type]
    except orjson.JSONDecodeError:
        return answer  # a malformed-answer fault stays malformed
    return web.Response(body=dumps(from_chat(body, completion, model)), content_type=JSON_TYPE)
