"""The gateway's other inbound dialects against a Gemini deployment: the anthropic SDK on
``/v1/messages`` and the openai SDK on ``/v1/responses``, both translated to chat
completions and from there to ``generateContent``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.helpers import GatewayProcess
from tests.integration.gemini.fake_gemini import MIN_CACHE_TOKENS, FakeGemini

TOOL = {
    "name": "lookup",
    "description": "Look a word up.",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
}
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture()
def claude(gateway: GatewayProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture()
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=20) as c:
        yield c


def test_messages_answer_with_cached_usage(claude: anthropic.Anthropic, fake: FakeGemini) -> None:
    system = "You are a careful harbor guide. " * (MIN_CACHE_TOKENS // 6)
    replies = [
        claude.messages.create(
            model="flash", max_tokens=64, system=system, messages=[{"role": "user", "content": question}]
        )
        for question in ("define harbor", "define quay")
    ]
    first, second = replies
    assert first.content[0].type == "text" and first.content[0].text.startswith("Hello from gemini-2.5-flash")
    assert first.stop_reason == "end_turn" and first.usage.output_tokens > 0
    assert second.usage.cache_read_input_tokens == len(system) // 4
    assert fake.requests[-1].body["systemInstruction"]["parts"][0]["text"] == system


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_round_trip(claude: anthropic.Anthropic, stream: bool) -> None:
    ask: list[Any] = [{"role": "user", "content": "define harbor"}]
    if stream:
        with claude.messages.stream(
            model="gemini3", max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ask
        ) as s:
            call = s.get_final_message()
    else:
        call = claude.messages.create(
            model="gemini3", max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ask
        )
    assert call.stop_reason == "tool_use"
    use = next(block for block in call.content if block.type == "tool_use")
    assert use.name == "lookup" and use.input == {"word": "sample"}
    answer = claude.messages.create(
        model="gemini3",
        max_tokens=64,
        tools=[TOOL],
        messages=[
            *ask,
            {"role": "assistant", "content": call.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a port"}],
            },
        ],
    )
    assert (
        answer.content[0].type == "text" and answer.content[0].text == 'Results: lookup={"output": "a port"}'
    )


def test_messages_stream_events(gateway: GatewayProcess) -> None:
    async def run() -> tuple[list[str], Any]:
        c = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="unused", max_retries=0)
        ask: list[Any] = [{"role": "user", "content": "stream please"}]
        async with c, c.messages.stream(model="flash", max_tokens=64, messages=ask) as stream:
            kinds = [event.type async for event in stream]
            return kinds, await stream.get_final_message()

    kinds, final = asyncio.run(run())
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].type == "text" and final.content[0].text.endswith("stream please")
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_responses_answer_and_stream(client: openai.OpenAI) -> None:
    response = client.responses.create(model="flash", input="Hi from responses")
    assert response.output_text == "Hello from gemini-2.5-flash: you said Hi from responses"
    assert response.usage is not None and response.usage.output_tokens > 0
    with client.responses.stream(model="flash", input="Streamed responses") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    assert final.output_text.endswith("Streamed responses")


def test_responses_function_call_round_trip(client: openai.OpenAI, fake: FakeGemini) -> None:
    first = client.responses.create(
        model="gemini3",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].arguments == '{"city":"sample"}'
    second = client.responses.create(
        model="gemini3",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp_c": 21}'}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == 'Results: get_weather={"output": "{\\"temp_c\\": 21}"}'


class Answer(BaseModel):
    answer: str


def test_responses_structured_output(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model="flash", input="Answer in JSON.", text_format=Answer)
    assert parsed.output_parsed == Answer(answer="sample")
