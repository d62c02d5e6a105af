"""Structured output, tool arguments and logprobs: the simulator answers what the request's
schemas ask for, so client code that parses them works against it as against a model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.helpers import GatewayProcess

MESSAGES: list[Any] = [{"role": "user", "content": "Plan a walk along the harbor."}]


class Stop(BaseModel):
    place: str
    minutes: int = Field(ge=5, le=90)


class Walk(BaseModel):
    title: str
    pace: Literal["slow", "brisk"]
    stops: list[Stop] = Field(min_length=2)
    note: str | None


class GetWeather(BaseModel):
    """The weather at a place on a day."""

    city: str
    day: str = Field(json_schema_extra={"format": "date"})
    unit: Literal["c", "f"]
    hours: list[int] = Field(min_length=1, max_length=3)


def _assert_args_validate(arguments: str, tool: Any) -> dict[str, Any]:
    args = json.loads(arguments)
    schema = tool["function"]["parameters"]
    validator = jsonschema.Draft202012Validator
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(args)
    return dict(args)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    reply = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Walk)
    walk = reply.choices[0].message.parsed
    assert isinstance(walk, Walk) and len(walk.stops) >= 2
    again = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=Walk)
    assert again.choices[0].message.parsed == walk  # same prompt, same answer
    assert reply.usage is not None and reply.usage.completion_tokens == -(
        -len(reply.choices[0].message.content or "") // 4
    )


def test_a_streamed_schema_answer_parses(client: openai.OpenAI) -> None:
    schema = {"name": "walk", "schema": Walk.model_json_schema()}
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        response_format={"type": "json_schema", "json_schema": schema},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    Walk.model_validate_json(text)


def test_tool_arguments_conform_to_the_tool_schema(client: openai.OpenAI) -> None:
    tool = openai.pydantic_function_tool(GetWeather)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=[tool], tool_choice="required")
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "GetWeather"  # type: ignore[union-attr]
    args = _assert_args_validate(call.function.arguments, tool)  # type: ignore[union-attr]
    assert set(args) == {"city", "day", "unit", "hours"}
    parsed = client.chat.completions.parse(model="m", messages=MESSAGES, tools=[tool], tool_choice="required")
    assert isinstance(parsed.choices[0].message.tool_calls[0].function.parsed_arguments, GetWeather)  # type: ignore[index, union-attr]


def test_streamed_tool_arguments_conform(client: openai.OpenAI) -> None:
    tool = openai.pydantic_function_tool(GetWeather)
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=[tool], tool_choice="required", stream=True
    )
    arguments = ""
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or []:
            arguments += (call.function.arguments or "") if call.function else ""
    _assert_args_validate(arguments, tool)


def test_json_object_mode_is_a_json_object(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_logprobs_when_asked(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="m", messages=MESSAGES)
    assert plain.choices[0].logprobs is None
    reply = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True, top_logprobs=3)
    content = reply.choices[0].message.content or ""
    lp = reply.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert "".join(t.token for t in lp.content) == content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token for t in lp.content)
    assert reply.usage is not None and reply.usage.completion_tokens == len(lp.content)
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, logprobs=True, top_logprobs=3, stream=True
    )
    streamed = [
        t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []
    ]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in lp.content]


def test_completions_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, logprobs=2)
    lp = reply.choices[0].logprobs
    assert lp is not None and "".join(lp.tokens or []) == reply.choices[0].text
    assert len(lp.token_logprobs or []) == 5 and all(len(t) == 2 for t in lp.top_logprobs or [])


def test_top_logprobs_needs_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="m", messages=MESSAGES, top_logprobs=2)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """``switchyard serve`` with no policy and no Redis: the zero-setup defaults."""
    workdir: Path = tmp_path_factory.mktemp("embedded")
    gw = GatewayProcess(None, redis_url=None, workdir=workdir).start()
    yield gw
    gw.stop()


def test_parse_tools_and_logprobs_through_the_gateway_on_the_embedded_defaults(
    embedded: GatewayProcess,
) -> None:
    client = openai.OpenAI(base_url=embedded.base_url, api_key="x", max_retries=0, timeout=30)
    for model in ("fast", "strong", "auto"):
        parsed = client.chat.completions.parse(model=model, messages=MESSAGES, response_format=Walk)
        assert isinstance(parsed.choices[0].message.parsed, Walk), model
    tool = openai.pydantic_function_tool(GetWeather)
    called = client.chat.completions.create(
        model="fast", messages=MESSAGES, tools=[tool], tool_choice="required"
    )
    _assert_args_validate(called.choices[0].message.tool_calls[0].function.arguments, tool)  # type: ignore[index, union-attr]
    with_lp = client.chat.completions.create(model="fast", messages=MESSAGES, logprobs=True, top_logprobs=2)
    assert with_lp.choices[0].logprobs is not None and with_lp.choices[0].logprobs.content
