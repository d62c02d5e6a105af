"""The Responses API through the gateway with the official Python SDK: a deployment that
gets it translated to chat completions (``sim-chat``) and one that gets it passed through
(``sim-native``, the simulator's own ``/v1/responses``)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import GatewayProcess, SimServer

MODELS = ["sim-chat", "sim-native"]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _policy(base_url: str) -> str:
    return f"""
deployments:
  sim-chat:
    {{provider: vllm, model: sim-fast, base_url: "{base_url}", response_model: deployment,
      price: {{input: 1.0, output: 2.0}}}}
  sim-native:
    {{provider: vllm, model: sim-fast, base_url: "{base_url}", responses_api: native, response_model: deployment,
      price: {{input: 1.0, output: 2.0}}}}
tiers:
  fast: [sim-chat]
  strong: [sim-native]
"""


@pytest.fixture(scope="module")
def gateways(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    workdir = tmp_path_factory.mktemp("gw")
    first = GatewayProcess(_policy(sim.base_url), redis_url=redis_url, workdir=workdir).start()
    second = GatewayProcess(
        _policy(sim.base_url), redis_url=redis_url, workdir=workdir, flush_redis=False
    ).start()
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture()
def client(gateways: tuple[GatewayProcess, GatewayProcess]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateways[0].base_url, api_key="k1", max_retries=0)


@pytest.mark.parametrize("model", MODELS)
def test_create_non_stream(client: openai.OpenAI, model: str) -> None:
    raw = client.responses.with_raw_response.create(
        model=model, instructions="Be terse.", input="Say hello.", max_output_tokens=64
    )
    response = raw.parse()
    assert response.object == "response"
    assert response.id.startswith("resp")
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens >= 0
    assert raw.headers["x-switchyard-model"] == model


@pytest.mark.parametrize("model", MODELS)
def test_create_async(gateways: tuple[GatewayProcess, GatewayProcess], model: str) -> None:
    async def main() -> str:
        async with openai.AsyncOpenAI(base_url=gateways[0].base_url, api_key="k1", max_retries=0) as client:
            response = await client.responses.create(model=model, input="Hi there.", store=False)
            return response.output_text

    assert asyncio.run(main())


@pytest.mark.parametrize("model", MODELS)
def test_stream_events(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input="Tell me a story.") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_item.added" in kinds
    assert "response.output_text.delta" in kinds
    assert kinds[-1] == "response.completed"
    assert final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0
    # A stored streamed response can be read back.
    assert client.responses.retrieve(final.id).output_text == final.output_text


@pytest.mark.parametrize("model", MODELS)
def test_function_call_round_trip(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp_c": 21}'}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert second.output_text
    assert second.previous_response_id == first.id


@pytest.mark.parametrize("model", MODELS)
def test_function_call_stream(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(
        model=model,
        input="Weather in Oslo?",
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    assert final.output[0].type == "function_call"


class Answer(BaseModel):
    answer: str


@pytest.mark.parametrize("model", MODELS)
def test_parse_structured_output(client: openai.OpenAI, model: str) -> None:
    parsed = client.responses.parse(model=model, input="Answer in JSON.", text_format=Answer)
    assert isinstance(parsed.output_parsed, Answer)


@pytest.mark.parametrize("model", MODELS)
def test_previous_response_across_replicas(
    gateways: tuple[GatewayProcess, GatewayProcess], model: str
) -> None:
    one = openai.OpenAI(base_url=gateways[0].base_url, api_key="k1", max_retries=0)
    two = openai.OpenAI(base_url=gateways[1].base_url, api_key="k1", max_retries=0)
    first = one.responses.create(model=model, input="My name is Ada.")
    second = two.responses.create(model=model, input="What is my name?", previous_response_id=first.id)
    assert second.output_text
    items = two.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["message"]
    # Another key does not see it.
    other = openai.OpenAI(base_url=gateways[1].base_url, api_key="k2", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=model, input="x", previous_response_id=first.id)
    two.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(first.id)


def test_hosted_tool_on_translated_deployment_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="sim-chat", input="news?", tools=[{"type": "web_search"}])
    assert info.value.body is not None
    assert info.value.body["param"] == "tools[0]"  # type: ignore[index]


def test_routing_auto_and_endpoint_label(
    client: openai.OpenAI, gateways: tuple[GatewayProcess, GatewayProcess]
) -> None:
    raw = client.responses.with_raw_response.create(model="auto", input="Hello")
    assert raw.headers["x-switchyard-route"]
    assert raw.parse().output_text
    metrics = urllib.request.urlopen(gateways[0].url + "/metrics").read().decode()
    assert 'endpoint="/v1/responses"' in metrics


@pytest.mark.parametrize("model", MODELS)
def test_stream_cut_after_start_ends_with_error_event(
    client: openai.OpenAI, sim: SimServer, model: str
) -> None:
    sim.set_fault("sim-fast", "reset_mid_stream=2", count=1)
    try:
        events = list(client.responses.create(model=model, input="Tell me a long story.", stream=True))
    finally:
        sim.clear_faults()
    assert events[0].type == "response.created"
    assert events[-1].type == "error"
    assert events[-1].code == "upstream_disconnected"  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_redis_down_stateless_works_stateful_is_503(
    sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A Redis of this test's own: pausing every client of the shared one would stall the
    # tests the other workers run against it at the same time.
    private = EmbeddedRedis()
    private.start()
    redis_url = private.url
    gw = GatewayProcess(_policy(sim.base_url), redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw"))
    gw.start()
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="k1", max_retries=0)
        first = client.responses.create(model="sim-chat", input="Hello")
        # Point the store at a Redis that is not there: the gateway's own connection is
        # shared, so stop answering by pausing the server for this client's commands.
        import redis as redis_lib

        admin = redis_lib.Redis.from_url(redis_url)
        admin.client_pause(3000, all=True)
        try:
            stateless = client.responses.create(model="sim-chat", input="Hi", store=False)
            assert stateless.output_text
            with pytest.raises(openai.InternalServerError) as info:
                client.responses.create(model="sim-chat", input="again", previous_response_id=first.id)
            assert info.value.status_code == 503
            assert info.value.code == "store_unavailable"
        finally:
            admin.client_unpause()
    finally:
        gw.stop()
        private.stop()


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_usage_and_cost_are_accounted(
    client: openai.OpenAI, gateways: tuple[GatewayProcess, GatewayProcess], model: str, stream: bool
) -> None:
    raw = client.responses.with_raw_response.create(model=model, input="Count me.", stream=stream)
    request_id = raw.headers["x-request-id"]
    if stream:
        list(raw.parse())
    else:
        raw.parse()
    line = gateways[0].wait_log(lambda line: line.get("request_id") == request_id)
    assert line["endpoint"] == "/v1/responses" and line["deployment"] == model
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0 and line["cost_usd"] > 0
    assert line["cached_tokens"] is not None


def test_native_event_that_is_not_json_ends_the_stream_with_an_error_and_logs_a_failure(
    client: openai.OpenAI, gateways: tuple[GatewayProcess, GatewayProcess], sim: SimServer
) -> None:
    # invalid_200: two good events, then one that ends in "}" but is not JSON.
    sim.set_fault("sim-fast", "invalid_200", count=1)
    try:
        raw = client.responses.with_raw_response.create(model="sim-native", input="Hello", stream=True)
        events = list(raw.parse())  # the SDK raised a bare JSONDecodeError on the bad event
    finally:
        sim.clear_faults()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and "response.completed" not in kinds
    assert kinds[-1] == "error" and events[-1].code == "malformed_chunk"  # type: ignore[union-attr]
    request_id = raw.headers["x-request-id"]
    line = gateways[0].wait_log(lambda line: line.get("request_id") == request_id)
    assert line["error_code"] == "malformed_chunk"
