"""The gemini and vertex providers over MockTransport: URLs, credentials, Google's errors
rewritten for dispatch, answers that are no answer; and their policy checks."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.config import PolicyError, parse_policy
from gateway.dispatch.backoff import retry_after_s
from gateway.dispatch.failures import status_error
from gateway.errors import InvalidRequestError, UpstreamError
from gateway.policy import Deployment
from gateway.providers.gemini import GeminiProvider, VertexProvider
from gateway.providers.mock import MockRequest, MockResponse, MockTransport

VERTEX_URL = (
    "https://europe-west4-aiplatform.googleapis.com/v1/projects/p1/locations/europe-west4/publishers/google"
)
ANSWER = {"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP"}]}
CHAT = {"model": "g", "messages": [{"role": "user", "content": "hello"}]}


def deployment(line: str) -> Deployment:
    return parse_policy(f"deployments:\n  g: {{{line}}}\ntiers: {{fast: [g]}}\n", "t.yaml").deployments["g"]


def gemini(**extra: str) -> Deployment:
    fields = {"provider": "gemini", "base_url": "https://generativelanguage.googleapis.com/v1beta"}
    fields.update({"model": "gemini-2.5-flash", "api_key_env": "GEM_KEY", **extra})
    return deployment(", ".join(f"{k}: {v!r}" for k, v in fields.items()))


def issues(line: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        deployment(line)
    return [str(i) for i in info.value.issues]


def run_send(provider: GeminiProvider, body: dict[str, Any], *, stream: bool) -> Any:
    prepared = provider.prepare(body, stream=stream, hints=None)
    return asyncio.run(provider.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=None))


def test_gemini_paths_and_key_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_KEY", "k-123")
    provider = GeminiProvider.create("g", gemini())
    transport = provider.transport
    assert getattr(transport, "_headers")["x-goog-api-key"] == "k-123"  # noqa: B009
    assert "Authorization" not in getattr(transport, "_headers")  # noqa: B009

    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse.json(ANSWER)

    mock = MockTransport(answer)
    provider = GeminiProvider("g", gemini(model="models/my model"), transport=mock)
    run_send(provider, CHAT, stream=False)
    run_send(provider, {**CHAT, "stream": True}, stream=True)
    assert [r.endpoint for r in mock.requests] == [
        "/models/my%20model:generateContent",
        "/models/my%20model:streamGenerateContent?alt=sse",
    ]
    assert mock.requests[0].body == {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


def test_vertex_sends_the_token_as_a_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTX_TOKEN", "ya29.t")
    provider = VertexProvider.create(
        "g", deployment(f"provider: vertex, base_url: {VERTEX_URL}, api_key_env: VTX_TOKEN")
    )
    headers = getattr(provider.transport, "_headers")  # noqa: B009
    assert headers["Authorization"] == "Bearer ya29.t" and "x-goog-api-key" not in headers


def _google_error(status: int, code: str, details: list[Any]) -> Any:
    async def fail(request: MockRequest) -> MockResponse:
        error = {"error": {"code": status, "message": f"{code} says no", "status": code, "details": details}}
        return MockResponse.json(error, status=status)

    return GeminiProvider("g", gemini(), transport=MockTransport(fail))


def test_throttling_delay_becomes_retry_after() -> None:
    retry = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.5s"}]
    resp = run_send(_google_error(429, "RESOURCE_EXHAUSTED", retry), CHAT, stream=False)
    assert resp.status == 429 and retry_after_s(resp.headers) == 2.5
    body = asyncio.run(resp.read())
    error = status_error("g", resp.status, body, resp.headers)
    assert error.status == 429 and error.code == "RESOURCE_EXHAUSTED"
    assert getattr(error, "retry_after_s", None) == 2.5


def test_a_wrong_api_key_is_an_auth_failure_not_the_clients_400() -> None:
    info = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]
    resp = run_send(_google_error(400, "INVALID_ARGUMENT", info), CHAT, stream=False)
    assert resp.status == 401
    plain = run_send(_google_error(400, "INVALID_ARGUMENT", []), CHAT, stream=False)
    assert plain.status == 400
    error = status_error("g", 400, asyncio.run(plain.read()), plain.headers)
    assert (
        error.status == 400
        and error.message == "INVALID_ARGUMENT says no"
        and error.code == "INVALID_ARGUMENT"
    )


def test_untranslatable_requests_and_endpoints_fail_inside_the_send() -> None:
    provider = GeminiProvider("g", gemini(), transport=MockTransport(lambda r: None))  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        run_send(provider, {**CHAT, "logit_bias": {"1": 1}}, stream=False)
    with pytest.raises(InvalidRequestError, match="'n'"):
        run_send(provider, {**CHAT, "n": 2, "stream": True}, stream=True)
    prepared = provider.prepare(CHAT, stream=False, hints=None)
    with pytest.raises(InvalidRequestError, match="/embeddings"):
        asyncio.run(provider.send("/embeddings", prepared.body, headers={}, connect_timeout_s=None))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty_answer"),
        (b"{nope", "invalid_answer"),
        (b'{"usageMetadata": {}}', "invalid_answer"),
        (orjson.dumps({"error": {"code": 500, "message": "x", "status": "INTERNAL"}}), "error_answer"),
    ],
)
def test_a_200_that_is_no_answer_fails_the_attempt(body: bytes, reason: str) -> None:
    provider = GeminiProvider("g", gemini(), transport=MockTransport(lambda r: None))  # type: ignore[arg-type,return-value]
    with pytest.raises(UpstreamError) as failed:
        provider.read_answer(body, "application/json", None)
    assert getattr(failed.value, "failure", None) == reason


def test_an_answer_is_a_chat_completion_with_usage() -> None:
    provider = GeminiProvider("g", gemini(), transport=MockTransport(lambda r: None))  # type: ignore[arg-type,return-value]
    answer = provider.read_answer(
        orjson.dumps({**ANSWER, "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1}}),
        "application/json",
        "shown",
    )
    completion = orjson.loads(answer.body)
    assert completion["model"] == "shown" and completion["choices"][0]["message"]["content"] == "hi"
    assert answer.usage is not None and answer.usage["total_tokens"] == 4


def test_policy_checks_are_located() -> None:
    assert issues("provider: vertex, base_url: https://aiplatform.googleapis.com/v1, api_key_env: T") == [
        "line 2: deployments.g: Value error, provider vertex: base_url must be https://{region}-aiplatform."
        "googleapis.com/v1/projects/{project}/locations/{region}/publishers/google"
    ]
    found = issues("provider: gemini, base_url: https://generativelanguage.googleapis.com/v1beta")
    assert found == [
        "line 2: deployments.g: Value error, provider gemini: set api_key_env to the variable holding the API key"
    ]
    found = issues(
        "provider: gemini, api_key_env: K, "
        "base_url: 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent'"
    )
    assert "without /models/" in found[0]
    found = issues(f"provider: vertex, base_url: {VERTEX_URL}, api_key_env: T, responses_api: native")
    assert "responses_api must be translate" in found[0]
    assert deployment(f"provider: vertex, base_url: {VERTEX_URL}, api_key_env: T").provider == "vertex"
    assert deployment(f"provider: vertex, base_url: {VERTEX_URL}, google_auth: metadata").api_key_env is None
    found = issues(
        "provider: gemini, base_url: https://g.example/v1beta, api_key_env: K, google_auth: metadata"
    )
    assert found == ["line 2: deployments.g: Value error, google_auth: metadata needs provider: vertex"]
