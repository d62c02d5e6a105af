"""The openai SDK through a real gateway process to the fake Gemini API (and Vertex AI):
chat completions translated to ``generateContent`` and back, stream and not, tools,
structured output, safety, errors, cached-token usage, and retries on Gemini's throttling."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess
from tests.integration.gemini.fake_gemini import API_KEY, MIN_CACHE_TOKENS, VERTEX_TOKEN, FakeGemini

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture()
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=20) as c:
        yield c


def test_chat_answer_is_translated_with_its_usage(client: openai.OpenAI, fake: FakeGemini) -> None:
    reply = client.chat.completions.create(
        model="flash",
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"}],
        max_tokens=100,
        temperature=0.2,
        stop=["END"],
        seed=7,
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == "Hello from gemini-2.5-flash: you said Hi there"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "gemini-2.5-flash-001"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    seen = fake.requests[-1]
    assert seen.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert seen.headers["x-goog-api-key"] == API_KEY and "Authorization" not in seen.headers
    assert seen.body["systemInstruction"] == {"parts": [{"text": "Be terse."}]}
    assert seen.body["contents"] == [{"role": "user", "parts": [{"text": "Hi there"}]}]
    assert seen.body["generationConfig"] == {
        "maxOutputTokens": 100,
        "temperature": 0.2,
        "seed": 7,
        "stopSequences": ["END"],
    }


def test_stream_arrives_as_chunks_with_usage_and_done(client: openai.OpenAI, fake: FakeGemini) -> None:
    stream = client.chat.completions.create(
        model="flash",
        messages=[{"role": "user", "content": "Stream it"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from gemini-2.5-flash: you said Stream it"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 2
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    seen = fake.requests[-1]
    assert seen.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent" and seen.query == "alt=sse"


def test_a_stream_cut_before_its_finish_ends_with_an_error(client: openai.OpenAI, fake: FakeGemini) -> None:
    fake.cut_next_stream()
    stream = client.chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "Stream it"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as cut:
        for chunk in stream:
            received.append(chunk)
    assert received and cut.value.code == "stream_incomplete", cut.value.message


def test_stream_without_include_usage_sends_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="flash", messages=[{"role": "user", "content": "Quiet"}], stream=True
        )
    )
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)


def test_tool_calls_round_trip_in_order(client: openai.OpenAI, fake: FakeGemini) -> None:
    question = {"role": "user", "content": "call the weather tool for both cities"}
    first = client.chat.completions.create(model="flash", messages=[question], tools=[WEATHER])
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and calls is not None and len(calls) == 2
    assert calls[0].id != calls[1].id and all(c.id.startswith("call_") for c in calls)
    # Arguments follow the declared property order.
    assert calls[0].function.arguments == '{"city":"sample","days":3}'
    declared = fake.requests[-1].body["tools"][0]["functionDeclarations"][0]
    assert declared["parametersJsonSchema"]["propertyOrdering"] == ["city", "days"]
    assert "parameters" not in declared
    messages: list[Any] = [
        question,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": '{"temp": 21}'},
    ]
    second = client.chat.completions.create(model="flash", messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == (
        'Results: get_weather={"output": "sunny"}; get_weather={"output": "{\\"temp\\": 21}"}'
    )
    sent = fake.requests[-1].body["contents"]
    assert [c["role"] for c in sent] == ["user", "model", "user"]
    assert [p["functionCall"]["args"] for p in sent[1]["parts"]] == [{"city": "sample", "days": 3}] * 2
    assert [p["functionResponse"]["response"] for p in sent[2]["parts"]] == [
        {"output": "sunny"},
        {"output": '{"temp": 21}'},
    ]


def test_gemini3_thought_signatures_survive_the_client_round_trip(client: openai.OpenAI) -> None:
    question = {"role": "user", "content": "call the weather tool"}
    first = client.chat.completions.create(model="gemini3", messages=[question], tools=[WEATHER])
    call = (first.choices[0].message.tool_calls or [])[0]
    assert first.usage is not None and first.usage.completion_tokens_details is not None
    assert first.usage.completion_tokens_details.reasoning_tokens == 7
    messages: list[Any] = [
        question,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "rain"},
    ]
    # The fake answers 400 (as Gemini 3 does) unless the call carries its signature back.
    second = client.chat.completions.create(model="gemini3", messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == 'Results: get_weather={"output": "rain"}'


def test_stream_tool_call_and_forced_tool_choice(client: openai.OpenAI, fake: FakeGemini) -> None:
    chunks = list(
        client.chat.completions.create(
            model="flash",
            messages=[{"role": "user", "content": "what now"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            stream=True,
        )
    )
    assert fake.requests[-1].body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "get_weather" and calls[0][0].id
    assert json.loads(calls[0][0].function.arguments or "") == {"city": "sample", "days": 3}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_structured_output_keeps_the_schema_order(client: openai.OpenAI, fake: FakeGemini) -> None:
    schema = {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
        "required": ["reasoning", "answer"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="flash",
        messages=[{"role": "user", "content": "How many?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "count", "schema": schema, "strict": True},
        },
    )
    assert reply.choices[0].message.content == '{"reasoning": "sample", "answer": 3}'
    config = fake.requests[-1].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["propertyOrdering"] == ["reasoning", "answer"]


def test_safety_finish_and_blocked_prompt_are_content_filter(client: openai.OpenAI) -> None:
    cut = client.chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "unsafe answer"}]
    )
    assert cut.choices[0].finish_reason == "content_filter"
    blocked = client.chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "blocked prompt"}]
    )
    assert blocked.choices[0].finish_reason == "content_filter"
    assert blocked.choices[0].message.refusal == "Gemini blocked the prompt (SAFETY)"
    chunks = list(
        client.chat.completions.create(
            model="flash", messages=[{"role": "user", "content": "blocked prompt"}], stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["content_filter"]


def test_max_tokens_is_a_length_finish(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "a long one please"}], max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"


def test_implicit_cache_hits_are_cached_tokens(client: openai.OpenAI) -> None:
    system = "You are the harbor master. " * (MIN_CACHE_TOKENS // 5)
    usages = []
    for question in ("Which berth?", "Which tug?"):
        reply = client.chat.completions.create(
            model="flash",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        usages.append(reply.usage)
    assert usages[0].prompt_tokens_details is not None and not usages[0].prompt_tokens_details.cached_tokens
    cached = usages[1].prompt_tokens_details
    assert cached is not None and cached.cached_tokens == len(system) // 4
    assert usages[1].prompt_tokens > (cached.cached_tokens or 0)


def test_throttling_is_retried_after_googles_retry_delay(gateway: GatewayProcess, fake: FakeGemini) -> None:
    fake.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded", retry_delay="1.2s")
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=20) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="flash", messages=[{"role": "user", "content": "again"}]
        )
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-switchyard-attempts"] == "2"
    first, second = fake.requests
    assert second.at - first.at >= 1.1  # the gateway waited RetryInfo's delay, not its own backoff


def test_throttling_longer_than_the_cap_reaches_the_client_with_its_delay(
    client: openai.OpenAI, fake: FakeGemini
) -> None:
    for _ in range(3):
        fake.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded for metric requests", retry_delay="30s")
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="flash", messages=[{"role": "user", "content": "x"}])
    assert time.monotonic() - started < 5  # not waited for: past dispatch.retries.retry_after_cap_s
    assert "rate limited" in limited.value.message and "Quota exceeded" not in limited.value.message
    assert limited.value.response.headers["Retry-After"] == "30"


def test_upstream_faults_and_bad_requests(client: openai.OpenAI, fake: FakeGemini) -> None:
    for _ in range(3):
        fake.fail_next(503, "UNAVAILABLE", "The model is overloaded.")
    with pytest.raises(openai.InternalServerError) as down:
        client.chat.completions.create(model="flash", messages=[{"role": "user", "content": "x"}])
    assert down.value.status_code == 503
    fake.fail_next(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="flash", messages=[{"role": "user", "content": "x"}])
    assert bad.value.code == "INVALID_ARGUMENT" and "invalid argument" in bad.value.message
    assert len(fake.requests) == 4  # the client's own mistake is not retried


def test_unsupported_parameters_are_a_clear_400(client: openai.OpenAI, fake: FakeGemini) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="flash", messages=[{"role": "user", "content": "x"}], logprobs=True
        )
    assert bad.value.code == "unsupported_parameter" and "logprobs" in bad.value.message
    assert fake.requests == []


def test_a_wrong_key_is_the_gateways_credential_failure(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="wrongkey", messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 502
    assert "rejected the gateway's credentials" in failed.value.message
    assert "not-the-key" not in failed.value.message


def test_vertex_url_form_and_bearer_token(client: openai.OpenAI, fake: FakeGemini) -> None:
    reply = client.chat.completions.create(model="vertex", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from gemini-2.5-pro: you said Hi"
    list(
        client.chat.completions.create(
            model="vertex", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
    )
    unary, stream = fake.requests
    base = "/v1/projects/proj-1/locations/europe-west4/publishers/google/models/gemini-2.5-pro"
    assert unary.path == base + ":generateContent"
    assert stream.path == base + ":streamGenerateContent" and stream.query == "alt=sse"
    assert (
        unary.headers["Authorization"] == f"Bearer {VERTEX_TOKEN}" and "x-goog-api-key" not in unary.headers
    )


def test_vertex_token_from_the_metadata_server_is_reused_until_near_its_expiry(
    client: openai.OpenAI, fake: FakeGemini
) -> None:
    def ask() -> str:
        client.chat.completions.create(model="vertex-md", messages=[{"role": "user", "content": "Hi"}])
        return fake.requests[-1].headers["Authorization"].removeprefix("Bearer ")

    fake.token_lifetime_s = 200  # less than the five minutes the gateway wants left
    short = [ask(), ask()]
    fake.token_lifetime_s = 3599
    long = [ask(), ask()]
    assert short == fake.issued[-3:-1] and short[0] != short[1]
    assert long == [fake.issued[-1]] * 2
