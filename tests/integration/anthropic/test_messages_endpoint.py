"""``/v1/messages`` through the gateway with the official anthropic SDK (sync, async, stream,
tools, count_tokens) over an Anthropic deployment (the simulator's Messages API) and an
OpenAI-compatible one (translated to chat completions)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest

from tests.helpers import GatewayProcess, SimServer

TOOL = {"name": "lookup", "description": "Look a word up.", "input_schema": {"type": "object"}}
ASK = [{"role": "user", "content": "define harbor"}]
SYSTEM = "You are a careful harbor guide who answers in one short paragraph. " * 80


@pytest.fixture()
def client(gateway: GatewayProcess, key: str) -> Any:
    with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=15) as c:
        yield c


@pytest.mark.parametrize("model", ["claude", "local"])
def test_sync_message(client: anthropic.Anthropic, model: str) -> None:
    raw = client.messages.with_raw_response.create(model=model, max_tokens=64, messages=ASK)
    message = raw.parse()
    assert raw.headers["x-switchyard-model"] == model
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0


@pytest.mark.parametrize("model", ["claude", "local"])
def test_async_stream(gateway: GatewayProcess, key: str, model: str) -> None:
    async def run() -> tuple[list[str], Any]:
        c = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)
        async with c, c.messages.stream(model=model, max_tokens=64, messages=ASK) as stream:
            kinds = [event.type async for event in stream]
            return kinds, await stream.get_final_message()

    kinds, final = asyncio.run(run())
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and final.content[0].text and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("model", ["claude", "local"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(client: anthropic.Anthropic, model: str, stream: bool) -> None:
    if stream:
        with client.messages.stream(
            model=model, max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ASK
        ) as s:
            call = s.get_final_message()
    else:
        call = client.messages.create(
            model=model, max_tokens=64, tools=[TOOL], tool_choice={"type": "any"}, messages=ASK
        )
    assert call.stop_reason == "tool_use"
    use = next(block for block in call.content if block.type == "tool_use")
    assert use.name == "lookup" and isinstance(use.input, dict)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "a sheltered port"}
    answer = client.messages.create(
        model=model,
        max_tokens=64,
        tools=[TOOL],
        tool_choice={"type": "none"},
        messages=[
            *ASK,
            {"role": "assistant", "content": call.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"


def test_count_tokens(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="claude", messages=[{"role": "user", "content": "x" * 400}])
    assert 100 <= counted.input_tokens < 140
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=ASK)


def test_gateway_breakpoints_give_cache_reads_on_the_anthropic_deployment(
    client: anthropic.Anthropic, both_sim: SimServer
) -> None:
    both_sim.reset()
    usages = [
        client.messages.create(
            model="claude", max_tokens=16, system=SYSTEM, messages=[{"role": "user", "content": question}]
        ).usage
        for question in ("one?", "two?")
    ]
    assert usages[0].cache_creation_input_tokens and not usages[0].cache_read_input_tokens
    assert usages[1].cache_read_input_tokens == usages[0].cache_creation_input_tokens


def test_errors_come_in_anthropics_shape(client: anthropic.Anthropic, gateway: GatewayProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=5, messages=ASK)
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="claude", max_tokens=5, messages=ASK, extra_body={"max_tokens": None})
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    wrong = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model="claude", max_tokens=5, messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_an_overloaded_anthropic_deployment_is_retried(
    client: anthropic.Anthropic, both_sim: SimServer
) -> None:
    both_sim.set_fault("claude-sim", "error=529", count=1)
    raw = client.messages.with_raw_response.create(model="claude", max_tokens=8, messages=ASK)
    assert raw.http_response.status_code == 200 and raw.headers["x-switchyard-attempts"] == "2"
    both_sim.set_fault("claude-sim", "error=529")
    try:
        with pytest.raises(anthropic.APIStatusError) as overloaded:
            client.messages.create(model="claude", max_tokens=8, messages=ASK)
        assert overloaded.value.status_code == 503
        assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    finally:
        both_sim.clear_faults()


def test_the_request_line_names_the_endpoint_with_key_tokens_and_cost(
    client: anthropic.Anthropic, gateway: GatewayProcess
) -> None:
    raw = client.messages.with_raw_response.create(model="claude", max_tokens=8, messages=ASK)
    rid = raw.headers["x-request-id"]
    line = gateway.wait_log(lambda entry: entry.get("request_id") == rid)
    assert line["endpoint"] == "/v1/messages" and line["deployment"] == "claude" and line["status"] == 200
    assert line["key_id"] and line["prompt_tokens"] > 0 and line["cost_usd"] > 0


def test_a_stream_cut_after_it_started_ends_with_an_error_event(
    client: anthropic.Anthropic, both_sim: SimServer
) -> None:
    both_sim.set_fault("claude-sim", "reset_mid_stream=3", count=1)
    try:
        stream = client.messages.stream(model="claude", max_tokens=64, messages=ASK)
        with pytest.raises(anthropic.APIStatusError) as cut, stream as events:
            for _ in events:
                pass
        assert cut.value.body["error"]["type"] == "api_error"  # type: ignore[index]
        assert cut.value.body["error"]["message"] in (  # type: ignore[index]
            "The connection to the upstream broke.",
            "The upstream ended the stream before it finished.",
        )
    finally:
        both_sim.clear_faults()
