"""The simulator's OpenAI endpoints as the official SDK (sync and async) and raw HTTP see them."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any

import openai
import pytest

from gateway.prompt_render import render_chat
from local_backend.sim import ModelProfile, SimConfig, SimControl, SimThread, token_count

SYSTEM = "You are a careful assistant. " * 10


def chat(user: str = "hello", system: str = SYSTEM) -> list[Any]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def post(
    sim: SimThread, path: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def sse_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n")
    return [event.removeprefix(b"data: ") for event in raw[:-2].split(b"\n\n")]


def test_chat_non_stream_shape_and_usage(client: openai.OpenAI) -> None:
    messages = chat("What is the tide?")
    reply = client.chat.completions.create(model="m", messages=messages)
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion" and reply.model == "m"
    assert abs(reply.created - time.time()) < 5
    choice = reply.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens == token_count(render_chat({"messages": messages}))
    assert usage.completion_tokens == token_count(choice.message.content.encode())
    assert 16 <= usage.completion_tokens <= 48
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_answers_are_deterministic_and_differ_by_prompt(client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model="m", messages=chat("same"))
    b = client.chat.completions.create(model="m", messages=chat("same"))
    c = client.chat.completions.create(model="m", messages=chat("different"))
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_cuts_with_finish_reason_length(client: openai.OpenAI, param: str) -> None:
    reply = client.chat.completions.create(model="m", messages=chat(), **{param: 5})  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert len(reply.choices[0].message.content or "") == 20
    roomy = client.chat.completions.create(model="m", messages=chat(), max_tokens=500)
    assert roomy.choices[0].finish_reason == "stop"


def test_stream_wire_format_without_usage(sim: SimThread) -> None:
    body = {"model": "m", "messages": chat(), "stream": True, "max_tokens": 4}
    status, headers, raw = post(sim, "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 1 + 4  # role chunk, then one chunk per token
    assert all("usage" not in c for c in chunks)  # not asked for: no usage key at all
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, None, "length"]
    assert all(len(c["choices"][0]["delta"]["content"]) == 4 for c in chunks[1:])


def test_stream_usage_only_in_a_final_chunk_when_asked(sim: SimThread) -> None:
    body = {"model": "m", "messages": chat(), "stream": True, "stream_options": {"include_usage": True}}
    _, _, raw = post(sim, "/v1/chat/completions", body)
    events = sse_events(raw)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == b"[DONE]"
    *content, last = chunks
    assert all(c["usage"] is None for c in content)  # present and null on every earlier chunk
    assert last["choices"] == []
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert last["usage"]["completion_tokens"] == len(content) - 1 == token_count(text.encode())
    assert (
        last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    )
    assert content[-1]["choices"][0]["finish_reason"] == "stop"


def test_sdk_stream_matches_the_non_stream_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="m", messages=chat("stream me"))
    chunks = list(
        client.chat.completions.create(
            model="m", messages=chat("stream me"), stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    plain = list(client.chat.completions.create(model="m", messages=chat("stream me"), stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == "stop"


def test_async_sdk_stream_and_non_stream(sim: SimThread) -> None:
    async def main() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client:
            whole = await client.chat.completions.create(model="m", messages=chat("async"))
            stream = await client.chat.completions.create(model="m", messages=chat("async"), stream=True)
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(main())
    assert whole and whole == streamed


def test_chunk_tokens_groups_tokens_per_event() -> None:
    config = SimConfig(
        models={"c": ModelProfile(ttft_ms=0, itl_ms=0, output_tokens=(10, 10))}, chunk_tokens=4
    )
    with SimThread(config) as sim:
        _, _, raw = post(sim, "/v1/chat/completions", {"model": "c", "messages": chat(), "stream": True})
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    pieces = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert [len(p) for p in pieces] == [16, 16, 8]  # 10 tokens: 4 + 4 + 2


def test_latency_is_ttft_plus_itl_per_token(client: openai.OpenAI) -> None:
    # "timed": TTFT 60 ms, ITL 10 ms, 10 tokens -> 60 + 9 * 10 = 150 ms.
    t0 = time.perf_counter()
    client.chat.completions.create(model="timed", messages=chat())
    whole_s = time.perf_counter() - t0
    assert 0.145 <= whole_s < 0.4
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model="timed", messages=chat(), stream=True)
    arrivals = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - t0)
    assert len(arrivals) == 10
    assert 0.055 <= arrivals[0] < 0.15
    assert 0.145 <= arrivals[-1] < 0.4
    # Nine gaps of 10 ms, on a schedule fixed from the request's start: a first token that a
    # busy machine delivers late shortens the spread the client sees, but a stream the server
    # buffered would arrive all at once.
    assert arrivals[-1] - arrivals[0] >= 0.045


def test_n_gives_several_choices(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=chat(), n=3, max_tokens=6)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) == 3
    assert reply.usage is not None and reply.usage.completion_tokens == 18
    chunks = list(client.chat.completions.create(model="m", messages=chat(), n=2, max_tokens=3, stream=True))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    # Same prompt, same choice index: the same answer, cut at 3 tokens instead of 6.
    assert texts == {c.index: (c.message.content or "")[:12] for c in reply.choices[:2]}


def test_json_mode_answers_a_json_object(client: openai.OpenAI) -> None:
    for fmt in (
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
    ):
        reply = client.chat.completions.create(model="m", messages=chat(), response_format=fmt)  # type: ignore[call-overload]
        assert set(json.loads(reply.choices[0].message.content or "")) == {"answer"}
        assert reply.choices[0].finish_reason == "stop"


TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}},
]


def test_required_or_named_tool_choice_answers_a_tool_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=chat(), tools=TOOLS, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "lookup" and json.loads(calls[0].function.arguments) == {}  # type: ignore[union-attr]
    named = client.chat.completions.create(
        model="m",
        messages=chat(),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "weather"}},
    )
    assert named.choices[0].message.tool_calls[0].function.name == "weather"  # type: ignore[index, union-attr]
    auto = client.chat.completions.create(model="m", messages=chat(), tools=TOOLS)
    assert auto.choices[0].finish_reason == "stop" and auto.choices[0].message.content


def test_streamed_tool_call_parses(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=chat(), tools=TOOLS, tool_choice="required", stream=True
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or []:
            name += (call.function.name or "") if call.function else ""
            arguments += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("lookup", {}, "tool_calls")


def test_legacy_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].finish_reason == "length" and len(reply.choices[0].text) == 16
    assert reply.usage is not None and reply.usage.prompt_tokens == 4 and reply.usage.completion_tokens == 4
    streamed = list(
        client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"
    several = client.completions.create(model="m", prompt=["Once", "upon a time"], max_tokens=2)
    assert [c.index for c in several.choices] == [0, 1]
    assert several.usage is not None and several.usage.prompt_tokens == 1 + 3
    ids = client.completions.create(model="m", prompt=[1, 2, 3, 4, 5], max_tokens=1)
    assert ids.usage is not None and ids.usage.prompt_tokens == 5


def test_models_and_health(client: openai.OpenAI, sim: SimThread) -> None:
    models = client.models.list()
    assert [m.id for m in models] == ["m", "timed", "prefill"]
    assert all(m.object == "model" for m in models)
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=5)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (200, b"")
    conn.close()


def test_errors_have_openai_shape(client: openai.OpenAI, sim: SimThread) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=chat())
    assert missing.value.code == "model_not_found"
    status, _, raw = post(sim, "/v1/chat/completions", b"{not json")
    error = json.loads(raw)["error"]
    assert status == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": chat()}, "model"),
        ({"model": 5, "messages": chat()}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": chat(), "max_tokens": "many"}, "max_tokens"),
        ({"model": "m", "messages": chat(), "stream_options": {"include_usage": True}}, "stream_options"),
    ]
    for body, param in cases:
        status, _, raw = post(sim, "/v1/chat/completions", body)
        assert (status, json.loads(raw)["error"]["param"]) == (400, param), body
    status, _, raw = post(sim, "/v1/chat/completions", [1, 2])  # type: ignore[arg-type]
    assert status == 400


def test_unknown_models_are_served_when_accepted() -> None:
    with SimThread(SimConfig(accept_any_model=True)) as sim:
        reply = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="anything-at-all", messages=chat()
        )
    assert reply.model == "anything-at-all" and reply.choices[0].message.content


def test_api_key_is_checked_when_required() -> None:
    with SimThread(SimConfig(require_api_key="sk-right")) as sim:
        wrong = openai.OpenAI(base_url=sim.base_url, api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.chat.completions.create(model="sim-fast", messages=chat())
        assert info.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=sim.base_url, api_key="sk-right", max_retries=0)
        assert right.chat.completions.create(model="sim-fast", messages=chat()).choices
        recent = sim.control.stats()["recent"]
    assert [(r["status"], r["authorization"]) for r in recent] == [(401, True), (200, True)]


def test_stats_record_headers_and_body_keys(client: openai.OpenAI, control: SimControl) -> None:
    client.chat.completions.create(
        model="m",
        messages=chat(),
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": "req-42", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
        extra_body={"prompt_cache_key": "tenant-7", "custom_field": 1},
    ).close()
    stats = control.stats()
    assert (stats["requests_total"], stats["by_model"]) == (1, {"m": 1})
    record = stats["recent"][-1]
    assert record["x-request-id"] == "req-42" and record["traceparent"].startswith("00-aaaa")
    assert record["authorization"] is True and record["stream"] is True
    assert record["endpoint"] == "/v1/chat/completions" and record["model"] == "m"
    assert {"custom_field", "prompt_cache_key", "stream_options"} <= set(record["body_keys"])
    assert record["stream_options"] == {"include_usage": True} and record["prompt_cache_key"] == "tenant-7"
    assert record["prompt_tokens"] > 0


def test_stats_count_outcomes(client: openai.OpenAI, control: SimControl) -> None:
    client.chat.completions.create(model="m", messages=chat())
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=chat())
    stats = control.stats()
    assert (stats["requests_total"], stats["completed"], stats["in_flight"], stats["cancelled"]) == (
        2,
        2,
        0,
        0,
    )
    assert [(r["model"], r["status"], r["outcome"]) for r in stats["recent"]] == [
        ("m", 200, "completed"),
        ("nope", 404, "completed"),
    ]
    control.reset()
    assert control.stats()["recent"] == []
