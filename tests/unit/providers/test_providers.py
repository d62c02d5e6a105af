"""Provider adapters: the dialect each one owns (request rewrite, answers, status classes)."""

from __future__ import annotations

import orjson
import pytest
import yaml

from gateway.config import PolicyError, parse_policy
from gateway.errors import UpstreamError
from gateway.providers.base import CacheHints
from gateway.providers.openai import OpenAIProvider
from gateway.providers.registry import PROVIDERS
from gateway.providers.vllm import VllmProvider

HINTS = CacheHints("abc123", 5, 0, prompt_cache_key=True)


def deployment(provider: str = "openai", extra: str = "") -> object:
    policy = parse_policy(
        f'deployments:\n  d: {{provider: {provider}, base_url: "http://d/v1", model: up{extra}}}\n'
        "tiers: {fast: [d], strong: [d]}\n",
        "t.yaml",
    )
    return policy.deployments["d"]


def test_openai_sends_its_model_cache_key_and_asks_for_stream_usage() -> None:
    provider = OpenAIProvider("d", deployment())  # type: ignore[arg-type]
    prepared = provider.prepare({"model": "fast", "messages": []}, stream=True, hints=HINTS)
    assert prepared.body["model"] == "up" and prepared.body["prompt_cache_key"] == "abc123"
    assert prepared.body["stream_options"] == {"include_usage": True} and prepared.strip_usage


def test_a_body_with_nothing_to_change_is_sent_as_parsed_and_others_are_copied() -> None:
    provider = OpenAIProvider("d", deployment())  # type: ignore[arg-type]
    body = {"model": "up", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    assert provider.prepare(body, stream=True, hints=None).body is body
    assert provider.prepare(body, stream=False, hints=None).body is body
    # Each change is made on a copy: hedged attempts share the client's body.
    for given, stream, hints in (
        ({"model": "fast", "messages": []}, False, None),
        ({"model": "up", "messages": []}, True, None),
        ({"model": "up", "messages": []}, False, HINTS),
    ):
        before = orjson.dumps(given)
        prepared = provider.prepare(given, stream=stream, hints=hints)
        assert prepared.body is not given and orjson.dumps(given) == before
        assert prepared.body["model"] == "up"


def test_vllm_differs_only_in_not_sending_prompt_cache_key() -> None:
    provider = VllmProvider("d", deployment("vllm"))  # type: ignore[arg-type]
    prepared = provider.prepare({"model": "fast", "messages": []}, stream=False, hints=HINTS)
    assert "prompt_cache_key" not in prepared.body and prepared.body["model"] == "up"


def test_answer_usage_and_model_rewrite() -> None:
    provider = OpenAIProvider("d", deployment(extra=", response_model: deployment"))  # type: ignore[arg-type]
    body = orjson.dumps({"model": "up", "usage": {"prompt_tokens": 4}})
    answer = provider.read_answer(body, "application/json", provider.shown_model("fast"))
    assert orjson.loads(answer.body)["model"] == "d" and answer.usage == {"prompt_tokens": 4}


def test_status_classes() -> None:
    provider = OpenAIProvider("d", deployment())  # type: ignore[arg-type]
    assert [provider.status_failure(s) for s in (429, 401, 404, 408, 503, 520, 422)] == [
        "429",
        "upstream_auth_failed",
        "upstream_not_found",
        "upstream_timed_out",
        "503",
        "upstream_failed",
        "client_error",
    ]


def test_policy_names_only_registered_providers() -> None:
    assert {"openai", "vllm", "anthropic", "azure", "deepseek", "gemini", "vertex", "bedrock"} <= set(
        PROVIDERS
    )
    try:
        deployment("nosuch")
    except PolicyError as exc:
        assert "deployments.d.provider: Input should be 'openai', 'vllm', 'anthropic', 'azure'" in str(exc)
    else:
        raise AssertionError("an unknown provider was accepted")


@pytest.mark.parametrize(
    ("body", "endpoint", "reason"),
    [
        (b"", "/chat/completions", "empty_answer"),
        (b"  \n", "/embeddings", "empty_answer"),
        (b'{"id": "x", "choices": [{"message": {"content": "cut', "/chat/completions", "invalid_answer"),
        (b'{"choices": [}', "/chat/completions", "invalid_answer"),
        (b"<html>bad gateway</html>", "/completions", "invalid_answer"),
        (b'["not", "an", "object"]', None, "invalid_answer"),
        (b'{"id": "x", "object": "chat.completion"}', "/chat/completions", "invalid_answer"),
        (b'{"object": "list", "choices": []}', "/embeddings", "invalid_answer"),
        (
            b'{"error": {"message": "overloaded", "code": "server_error"}}',
            "/chat/completions",
            "error_answer",
        ),
        (b'{"object": "error", "message": "boom", "code": 500}', None, "error_answer"),
    ],
)
def test_a_200_that_is_no_answer_fails_like_a_5xx(body: bytes, endpoint: str | None, reason: str) -> None:
    provider = OpenAIProvider("d", deployment())  # type: ignore[arg-type]
    with pytest.raises(UpstreamError) as info:
        provider.read_answer(body, "application/json", None, endpoint=endpoint)
    assert info.value.failure == reason and info.value.code == reason
    assert info.value.http_status == 502


def test_a_valid_answer_passes_unchanged() -> None:
    provider = OpenAIProvider("d", deployment())  # type: ignore[arg-type]
    body = b'{"object": "list", "data": [{"embedding": [0.1]}], "usage": {"prompt_tokens": 1}}'
    answer = provider.read_answer(body, "application/json", None, endpoint="/embeddings")
    assert answer.body is body and answer.usage == {"prompt_tokens": 1}


@pytest.mark.parametrize(
    ("provider", "url"),
    [
        ("openai", "https://api.openai.com/v1"),
        ("anthropic", "https://api.anthropic.com/v1"),
        (None, "https://api.openai.com/v1"),
    ],
)
def test_a_hosted_provider_without_base_url_gets_its_public_api(provider: str | None, url: str) -> None:
    spec = {"api_key_env": "KEY"} if provider is None else {"provider": provider, "api_key_env": "KEY"}
    policy = parse_policy(yaml.safe_dump({"deployments": {"d": spec}, "tiers": {"fast": ["d"]}}), "p")
    assert policy.deployments["d"].base_url == url


def test_a_self_hosted_provider_still_needs_its_base_url() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(
            yaml.safe_dump({"deployments": {"d": {"provider": "vllm"}}, "tiers": {"fast": ["d"]}}), "p"
        )
    assert "deployments.d.base_url" in str(info.value)
