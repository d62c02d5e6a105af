"""Which way a deployment gets a Responses request, against a mock transport."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.config import parse_policy
from gateway.dialects.responses.providers import ResponsesRequestState, responses_api
from gateway.providers.base import Provider
from gateway.providers.mock import MockRequest, MockResponse, MockTransport
from gateway.providers.openai import OpenAIProvider
from gateway.providers.vllm import VllmProvider

POLICY = """
deployments:
  oa: {provider: openai, base_url: "http://o/v1", model: up-o}
  vl: {provider: vllm, base_url: "http://v/v1", model: up-v}
  vl-native: {provider: vllm, base_url: "http://v/v1", model: up-v, responses_api: native}
tiers: {fast: [vl], strong: [oa]}
"""


def provider(name: str, sent: list[MockRequest]) -> Provider:
    deployment = parse_policy(POLICY, "p.yaml").deployments[name]
    cls = OpenAIProvider if deployment.provider == "openai" else VllmProvider

    async def handler(request: MockRequest) -> MockResponse:
        sent.append(request)
        if request.endpoint == "/chat/completions":
            message = {"role": "assistant", "content": "hi"}
            return MockResponse.json(
                {"model": "up-v", "choices": [{"message": message, "finish_reason": "stop"}]}
            )
        return MockResponse.json({"id": "resp_up", "object": "response", "model": "up-o", "output": []})

    return cls(name, deployment, transport=MockTransport(handler))


def test_defaults_per_provider_and_the_policy_override() -> None:
    sent: list[MockRequest] = []
    assert [responses_api(provider(n, sent)) for n in ("oa", "vl", "vl-native")] == [
        "native",
        "translate",
        "native",
    ]


def test_native_and_translated_send_to_their_endpoints() -> None:
    history = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "before"}]}
    ]
    request: dict[str, Any] = {"model": "x", "input": "hello", "previous_response_id": "resp_1"}
    state = ResponsesRequestState(request, history)

    async def run(name: str) -> tuple[MockRequest, dict[str, Any]]:
        sent: list[MockRequest] = []
        adapted = state.adapt(provider(name, sent))
        prepared = adapted.prepare(request, stream=False, hints=None)
        resp = await adapted.send("/responses", prepared.body, headers={}, connect_timeout_s=None)
        answer = adapted.read_answer(await resp.read(), "application/json", None)
        return sent[0], orjson.loads(answer.body)

    native_sent, native_answer = asyncio.run(run("oa"))
    assert native_sent.endpoint == "/responses" and native_sent.body["model"] == "up-o"
    # The stored conversation goes as input items; the client still sees its id.
    assert "previous_response_id" not in native_sent.body
    assert native_sent.body["input"][0] == history[0]
    assert native_answer["previous_response_id"] == "resp_1"

    chat_sent, chat_answer = asyncio.run(run("vl"))
    assert chat_sent.endpoint == "/chat/completions" and chat_sent.body["model"] == "up-v"
    assert [m["role"] for m in chat_sent.body["messages"]] == ["assistant", "user"]
    assert chat_answer["object"] == "response" and chat_answer["output"][0]["content"][0]["text"] == "hi"


def test_the_pool_sees_the_wrapped_provider() -> None:
    inner = provider("vl", [])
    adapted = ResponsesRequestState({"model": "x"}).adapt(inner)
    assert adapted == inner and hash(adapted) == hash(inner) and adapted.name == "vl"
    assert {inner: 1}[adapted] == 1


def test_a_native_stream_whose_first_event_is_not_json_falls_to_the_next_deployment() -> None:
    from gateway.dialects.responses.stream import sse_event
    from tests.unit.dispatch.test_dispatcher import FAST, Setup
    from tests.unit.dispatch.test_integrity import raw, read_stream, stream_of
    from tests.unit.dispatch.virtual_time import run

    # "a" (openai: native) opens with an event that ends in "}" but is not JSON; "b" (vllm:
    # translated) answers a chat stream.
    bad = b'event: response.created\ndata: {"type": "response.created", "response": {]}\n\n'
    completed = sse_event({"type": "response.completed", "response": {"id": "r", "output": []}})
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"delta": {"content": "x"}}],
    }
    setup = Setup({"a": raw(bad, completed), "b": stream_of(chunk)})
    ctx = setup.ctx()
    request: dict[str, Any] = {"model": "fast", "input": "hi", "stream": True}

    async def go() -> Any:
        state = ResponsesRequestState(dict(request))
        opened = await setup.dispatcher.open_stream(ctx, FAST, "/responses", request, state.adapt)
        return await read_stream(opened)

    blocks, error = run(go())
    assert error is None and (ctx.deployment, ctx.attempts) == ("b", 2)
    assert b"response.completed" in b"".join(blocks) and b"{]}" not in b"".join(blocks)
