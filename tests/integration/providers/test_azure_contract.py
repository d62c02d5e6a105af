"""The official openai and anthropic SDKs through a gateway process to a fake Azure OpenAI
resource (:mod:`tests.integration.providers.azure_fake`): both URL forms and both kinds of
auth, stream and not, tools, structured output, Azure's content filter, cached-token usage,
and a retry that waits what Azure's throttling headers ask."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.helpers import GatewayProcess
from tests.integration.providers.azure_fake import KEY, TOKEN, FakeAzure

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def azure() -> Iterator[FakeAzure]:
    with FakeAzure() as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(
    azure: FakeAzure, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    policy = f"""
deployments:
  az-v1: {{provider: azure, base_url: "{azure.url}", model: gpt-4o-mini, api_key_env: AZ_TEST_KEY}}
  az-dep:
    provider: azure
    base_url: "{azure.url}"
    model: gpt-4o
    azure: {{api: deployments, deployment: my-gpt4o, api_version: "2024-10-21", token_env: AZ_TEST_TOKEN}}
  az-bad-key: {{provider: azure, base_url: "{azure.url}", model: gpt-4o-mini, api_key_env: AZ_BAD_KEY}}
tiers: {{fast: [az-v1], strong: [az-dep]}}
"""
    gw = GatewayProcess(
        policy,
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("azure-gw"),
        env={"AZ_TEST_KEY": KEY, "AZ_TEST_TOKEN": TOKEN, "AZ_BAD_KEY": "not-the-key"},
    )
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=15) as c:
        yield c


def _last(azure: FakeAzure) -> dict[str, Any]:
    return azure.requests[-1]


def test_v1_path_sends_the_model_in_the_body_and_the_api_key_header(
    client: openai.OpenAI, azure: FakeAzure
) -> None:
    reply = client.chat.completions.create(model="az-v1", messages=[{"role": "user", "content": "Hi v1"}])
    assert reply.choices[0].message.content == "Hello from Azure."
    sent = _last(azure)
    assert sent["path"] == "/openai/v1/chat/completions" and sent["query"] == {}
    assert sent["body"]["model"] == "gpt-4o-mini"
    assert sent["headers"]["api-key"] == KEY and "Authorization" not in sent["headers"]
    # Azure's content-filter fields reach the client in OpenAI's answer, untouched.
    extra = reply.model_dump()
    assert extra["prompt_filter_results"][0]["content_filter_results"]["hate"]["filtered"] is False
    assert extra["choices"][0]["content_filter_results"]["violence"]["severity"] == "safe"


def test_deployment_path_with_api_version_and_entra_token(client: openai.OpenAI, azure: FakeAzure) -> None:
    reply = client.chat.completions.create(model="az-dep", messages=[{"role": "user", "content": "Hi dep"}])
    assert reply.choices[0].finish_reason == "stop"
    sent = _last(azure)
    assert sent["path"] == "/openai/deployments/my-gpt4o/chat/completions"
    assert sent["query"] == {"api-version": "2024-10-21"}
    assert sent["headers"]["Authorization"] == f"Bearer {TOKEN}" and "api-key" not in sent["headers"]
    # The dated API rejects arguments it does not know: no prompt_cache_key there.
    assert "prompt_cache_key" not in sent["body"]


def test_stream_passes_the_prompt_filter_chunk_and_strips_the_usage_it_asked_for(
    client: openai.OpenAI, azure: FakeAzure
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="az-v1", messages=[{"role": "user", "content": "Stream to me"}], stream=True
        )
    )
    first = chunks[0].model_dump()
    assert first["choices"] == [] and first["prompt_filter_results"][0]["prompt_index"] == 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "Hello from Azure."
    assert chunks[-1].choices[0].finish_reason == "stop" and all(c.usage is None for c in chunks)
    assert _last(azure)["body"]["stream_options"] == {"include_usage": True}


def test_stream_usage_when_the_client_asks(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="az-dep",
            messages=[{"role": "user", "content": "Count my tokens"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_tools_stream_and_not(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    reply = client.chat.completions.create(model="az-v1", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls
    assert (
        call
        and call[0].function.name == "weather"
        and json.loads(call[0].function.arguments) == {"city": "Oslo"}
    )
    chunks = list(client.chat.completions.create(model="az-dep", messages=messages, tools=TOOLS, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function and calls[0].function.name == "weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_structured_output(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="az-v1",
        messages=[{"role": "user", "content": "Structured please"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert json.loads(reply.choices[0].message.content or "") == {"answer": "x"}


def test_prompt_filter_is_a_clear_400_not_retried(client: openai.OpenAI, azure: FakeAzure) -> None:
    before = len(azure.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="az-v1", messages=[{"role": "user", "content": "FILTER-PROMPT now"}]
        )
    error = caught.value
    assert error.status_code == 400 and error.code == "content_filter" and error.param == "prompt"
    assert error.type == "invalid_request_error" and "content management policy" in error.message
    body: Any = error.body
    assert body["innererror"]["content_filter_result"]["violence"]["filtered"] is True
    assert error.response.headers.get("x-should-retry") == "false"
    assert len(azure.requests) == before + 1
    # Refused prompts are the client's, not the deployment's: its circuit (5 failures) stays closed.
    for _ in range(6):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="az-v1", messages=[{"role": "user", "content": "FILTER-PROMPT"}]
            )
    reply = client.chat.completions.create(
        model="az-v1", messages=[{"role": "user", "content": "Still there?"}]
    )
    assert reply.choices[0].message.content == "Hello from Azure."


def test_a_rejected_key_is_the_gateways_fault(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="az-bad-key", messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 502 and caught.value.code == "upstream_auth_failed"
    assert "not-the-key" not in caught.value.message


def test_filtered_output_is_an_answer(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="az-v1", messages=[{"role": "user", "content": "FILTER-OUTPUT x"}]
    )
    assert reply.choices[0].finish_reason == "content_filter"
    chunks = list(
        client.chat.completions.create(
            model="az-v1", messages=[{"role": "user", "content": "FILTER-OUTPUT y"}], stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    filtered = chunks[-1].model_dump()["choices"][0]["content_filter_results"]["violence"]
    assert filtered == {"filtered": True, "severity": "high"}


def test_cached_tokens_in_usage_and_accounting(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    messages: list[Any] = [{"role": "user", "content": "A long shared prefix " * 20}]
    client.chat.completions.create(model="az-v1", messages=messages)
    again = client.chat.completions.create(model="az-v1", messages=messages)
    assert again.usage and again.usage.prompt_tokens_details
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached and cached == again.usage.prompt_tokens
    gateway.wait_log(lambda line: line.get("cached_tokens") == cached)


def test_throttling_is_retried_after_retry_after_ms(client: openai.OpenAI, azure: FakeAzure) -> None:
    content = f"THROTTLE-1 {time.time()}"
    started = time.monotonic()
    reply = client.chat.completions.create(model="az-v1", messages=[{"role": "user", "content": content}])
    waited_s = time.monotonic() - started
    assert reply.choices[0].message.content == "Hello from Azure."
    tries = [r for r in azure.requests if r["body"]["messages"][0]["content"] == content]
    assert len(tries) == 2
    # retry-after-ms (200 ms) wins over Retry-After (3 s).
    assert 0.2 <= waited_s < 2.5


def test_throttling_that_outlasts_the_retries_is_a_429(client: openai.OpenAI) -> None:
    content = f"THROTTLE-9 {time.time()}"
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="az-v1", messages=[{"role": "user", "content": content}])
    assert caught.value.response.headers.get("Retry-After") == "1"


def test_anthropic_sdk_messages_through_azure(gateway: GatewayProcess) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=15) as c:
        message = c.messages.create(
            model="az-dep", max_tokens=64, messages=[{"role": "user", "content": "Hello Claude-style"}]
        )
        assert message.content[0].type == "text" and message.content[0].text == "Hello from Azure."
        with c.messages.stream(
            model="az-v1", max_tokens=64, messages=[{"role": "user", "content": "Stream Claude-style"}]
        ) as stream:
            text = "".join(stream.text_stream)
        assert text.strip() == "Hello from Azure."
        with pytest.raises(anthropic.BadRequestError):
            c.messages.create(
                model="az-v1", max_tokens=64, messages=[{"role": "user", "content": "FILTER-PROMPT"}]
            )


def test_responses_api_through_azure(client: openai.OpenAI, azure: FakeAzure) -> None:
    response = client.responses.create(model="az-v1", input="Hello Responses", store=False)
    assert response.output_text == "Hello from Azure."
    assert _last(azure)["path"] == "/openai/v1/chat/completions"
    streamed = client.responses.create(model="az-dep", input="Stream Responses", store=False, stream=True)
    kinds = [event.type for event in streamed]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds


def test_policy_errors_name_the_azure_key(tmp_path: Path) -> None:
    from gateway.config import PolicyError, parse_policy

    text = """
deployments:
  az: {provider: azure, base_url: "https://r.openai.azure.com/openai/v1", api_key_env: K}
  other: {provider: openai, base_url: "http://x/v1", azure: {api: v1}}
"""
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    shown = str(caught.value)
    assert "line 3: deployments.az" in shown and "base_url is the resource endpoint" in shown
    assert "line 4: deployments.other" in shown and "azure: needs provider: azure" in shown
