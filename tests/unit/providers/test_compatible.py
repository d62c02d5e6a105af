"""The OpenAI-compatible presets and the Azure adapter over MockTransport: each quirk that
changes what is sent or what is accounted."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.config import parse_policy
from gateway.errors import InvalidRequestError
from gateway.policy import Deployment
from gateway.providers.azure import AzureProvider
from gateway.providers.base import CacheHints
from gateway.providers.compatible import CompatibleProvider
from gateway.providers.mock import MockRequest, MockResponse, MockTransport
from gateway.providers.presets import PRESETS
from gateway.providers.registry import PROVIDERS

HINTS = CacheHints("abc123", 5, 0, prompt_cache_key=True)


def deployment(provider: str, extra: str = "") -> Deployment:
    policy = parse_policy(
        f"deployments:\n  d: {{provider: {provider}, model: up{extra}}}\ntiers: {{fast: [d], strong: [d]}}\n",
        "t.yaml",
    )
    return policy.deployments["d"]


def compatible(provider: str, reply: MockResponse | None = None) -> tuple[CompatibleProvider, MockTransport]:
    async def answer(request: MockRequest) -> MockResponse:
        return reply or MockResponse.json({"choices": []})

    transport = MockTransport(answer)
    return CompatibleProvider("d", deployment(provider), transport), transport


def test_every_preset_is_a_registered_provider_with_a_default_base_url() -> None:
    for name, preset in PRESETS.items():
        assert PROVIDERS[name] == "gateway.providers.compatible:CompatibleProvider"
        assert deployment(name).base_url == preset.base_url
    assert deployment("deepseek", ', base_url: "http://mine/v1"').base_url == "http://mine/v1"


def test_deepseek_cache_hits_become_openais_cached_tokens() -> None:
    provider, _ = compatible("deepseek")
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 5,
        "prompt_cache_hit_tokens": 1024,
        "prompt_cache_miss_tokens": 176,
    }
    answer = provider.read_answer(orjson.dumps({"model": "up", "choices": [], "usage": usage}), "", None)
    assert answer.usage is not None and answer.usage["prompt_tokens_details"] == {"cached_tokens": 1024}
    assert orjson.loads(answer.body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024
    scanner = provider.scanner(strip_usage=False, shown_model=None)
    chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
    forwarded = scanner.feed(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
    assert scanner.usage is not None and scanner.usage["prompt_tokens_details"]["cached_tokens"] == 1024
    assert b"prompt_cache_hit_tokens" in forwarded and scanner.done


def test_llamacpp_cache_n_from_timings() -> None:
    provider, _ = compatible("llamacpp")
    body = {"choices": [], "usage": {"prompt_tokens": 300}, "timings": {"cache_n": 256, "prompt_n": 44}}
    answer = provider.read_answer(orjson.dumps(body), "", None)
    assert answer.usage == {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}


def test_a_reported_cached_tokens_field_is_left_alone() -> None:
    provider, _ = compatible("llamacpp")
    usage = {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 200}}
    raw = orjson.dumps({"choices": [], "usage": usage, "timings": {"cache_n": 256}})
    answer = provider.read_answer(raw, "", None)
    assert answer.usage == usage and answer.body == raw


def test_groq_stream_usage_is_read_from_x_groq() -> None:
    provider, _ = compatible("groq")
    scanner = provider.scanner(strip_usage=False, shown_model=None)
    chunk = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "x_groq": {"id": "r", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    }
    scanner.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert scanner.usage == {"prompt_tokens": 9, "completion_tokens": 3}


@pytest.mark.parametrize(("field", "value"), [("logprobs", True), ("logit_bias", {"50256": -100}), ("n", 2)])
def test_groq_refuses_what_it_cannot_do_without_sending(field: str, value: Any) -> None:
    provider, transport = compatible("groq")
    prepared = provider.prepare({"model": "m", "messages": [], field: value}, stream=False, hints=None)
    with pytest.raises(InvalidRequestError) as caught:
        asyncio.run(provider.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=None))
    assert caught.value.param == field and caught.value.status == 400 and "groq" in caught.value.message
    assert transport.requests == []


def test_groq_drops_harmless_defaults_and_message_names() -> None:
    provider, _ = compatible("groq")
    body = {
        "model": "m",
        "n": 1,
        "logprobs": False,
        "messages": [{"role": "user", "name": "ann", "content": "hi"}],
    }
    prepared = provider.prepare(body, stream=False, hints=None)
    assert "n" not in prepared.body and "logprobs" not in prepared.body
    assert prepared.body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["messages"][0]["name"] == "ann"  # the shared body is left as it was


def test_mistral_never_gets_stream_options() -> None:
    provider, _ = compatible("mistral")
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    prepared = provider.prepare(body, stream=True, hints=HINTS)
    assert "stream_options" not in prepared.body and not prepared.strip_usage
    assert "prompt_cache_key" not in prepared.body


def test_plain_presets_still_ask_for_stream_usage() -> None:
    provider, _ = compatible("together")
    prepared = provider.prepare({"model": "m", "messages": []}, stream=True, hints=HINTS)
    assert prepared.body["stream_options"] == {"include_usage": True} and prepared.strip_usage
    assert prepared.body["model"] == "up" and "prompt_cache_key" not in prepared.body


def azure(extra: str) -> tuple[AzureProvider, MockTransport]:
    policy = parse_policy(
        'deployments:\n  d: {provider: azure, base_url: "https://r.openai.azure.com", model: gpt-4o'
        + extra
        + "}\n"
        + "tiers: {fast: [d], strong: [d]}\n",
        "t.yaml",
    )

    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse.json({"choices": []})

    transport = MockTransport(answer)
    return AzureProvider("d", policy.deployments["d"], transport), transport


@pytest.mark.parametrize(
    ("extra", "endpoint", "path"),
    [
        (", api_key_env: K", "/chat/completions", "/openai/v1/chat/completions"),
        (
            ", api_key_env: K, azure: {api_version: preview}",
            "/responses",
            "/openai/v1/responses?api-version=preview",
        ),
        (
            ", api_key_env: K, azure: {api: deployments}",
            "/embeddings",
            "/openai/deployments/gpt-4o/embeddings?api-version=2024-10-21",
        ),
        (
            ", azure: {api: deployments, deployment: my dep, token_env: T}",
            "/chat/completions",
            "/openai/deployments/my%20dep/chat/completions?api-version=2024-10-21",
        ),
    ],
)
def test_azure_paths(extra: str, endpoint: str, path: str) -> None:
    provider, transport = azure(extra)
    asyncio.run(provider.send(endpoint, {"model": "gpt-4o"}, headers={}, connect_timeout_s=None))
    assert transport.requests[-1].endpoint == path


def test_azure_sends_prompt_cache_key_only_on_v1() -> None:
    v1, _ = azure(", api_key_env: K")
    dated, _ = azure(", api_key_env: K, azure: {api: deployments}")
    assert v1.prepare({"messages": []}, stream=False, hints=HINTS).body["prompt_cache_key"] == "abc123"
    assert "prompt_cache_key" not in dated.prepare({"messages": []}, stream=False, hints=HINTS).body


def test_azure_stream_model_rewrite_learns_the_model_version() -> None:
    provider, _ = azure(", api_key_env: K, response_model: deployment")
    scanner = provider.scanner(strip_usage=False, shown_model=provider.shown_model("fast"))
    filter_chunk = b'data: {"choices":[],"id":"","model":"","prompt_filter_results":[]}\n\n'
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"model":"gpt-4o-2024-08-06"}\n\n'
    # The model field arrives split across two reads.
    out = scanner.feed(filter_chunk + chunk[:60]) + scanner.feed(chunk[60:] + chunk + b"data: [DONE]\n\n")
    assert out.count(b'"model":"d"') == 2 and b"2024-08-06" not in out and b'"model":""' in out
    plain = provider.scanner(strip_usage=False, shown_model=None)
    assert b"2024-08-06" in plain.feed(chunk)
