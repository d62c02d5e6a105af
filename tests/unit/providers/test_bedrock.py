"""The bedrock provider: its policy keys checked at load, SigV4 headers, errors as dispatch
reads them, over MockTransport (the signature itself is verified by the fake runtime of
the integration tests)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import PolicyError, parse_policy
from gateway.errors import UpstreamError
from gateway.policy import Deployment
from gateway.providers.bedrock import BedrockProvider
from gateway.providers.mock import MockRequest, MockResponse, MockTransport
from tests.fixtures.fake_bedrock import event, exception

AWS = {
    "AWS_ACCESS_KEY_ID": "AKIDUNIT",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def parse(entry: str) -> Deployment:
    policy = parse_policy(
        f"deployments:\n  b: {entry}\ntiers: {{fast: [b], strong: [b]}}\n", "t.yaml", env={}
    )
    return policy.deployments["b"]


def issues(entry: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse(entry)
    return [str(issue) for issue in info.value.issues]


def test_base_url_comes_from_the_region_or_the_endpoint() -> None:
    public = parse("{provider: bedrock, model: amazon.nova-pro-v1:0, bedrock: {region: eu-west-1}}")
    assert public.base_url == "https://bedrock-runtime.eu-west-1.amazonaws.com"
    vpc = parse('{provider: bedrock, bedrock: {region: eu-west-1, endpoint_url: "https://vpce-1.example/"}}')
    assert vpc.base_url == "https://vpce-1.example"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            "{provider: bedrock, model: m}",
            "deployments.b: Value error, provider bedrock needs a bedrock: section",
        ),
        (
            "{provider: bedrock, bedrock: {region: mars}}",
            "deployments.b.bedrock.region: Value error, not an AWS region",
        ),
        ("{provider: bedrock, bedrock: {}}", "deployments.b.bedrock.region: required key missing"),
        ('{provider: bedrock, base_url: "https://x", bedrock: {region: us-east-1}}', "leave base_url out"),
        (
            '{provider: openai, base_url: "https://x", bedrock: {region: us-east-1}}',
            "bedrock: needs provider: bedrock",
        ),
        (
            "{provider: bedrock, bedrock: {region: us-east-1, profle: p}}",
            "deployments.b.bedrock.profle: unknown key",
        ),
    ],
)
def test_bad_bedrock_settings_are_located_errors(entry: str, expected: str) -> None:
    found = issues(entry)
    assert len(found) == 1 and expected in found[0], found


def test_without_botocore_the_policy_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "botocore" else real(name, *a)
    )
    (found,) = issues("{provider: bedrock, bedrock: {region: us-east-1}}")
    assert found.endswith("pip install 'switchyard[bedrock]'")


def provider(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> BedrockProvider:
    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse.json(body if body is not None else {}, status=status, headers=headers)

    deployment = parse('{provider: bedrock, model: "anthropic.claude-v2:1", bedrock: {region: us-west-2}}')
    return BedrockProvider("b", deployment, transport=MockTransport(answer))


def send(upstream: BedrockProvider, *, stream: bool = False) -> Any:
    prepared = upstream.prepare(
        {"model": "b", "messages": [{"role": "user", "content": "hi"}]}, stream=stream, hints=None
    )
    return asyncio.run(
        upstream.send("/chat/completions", prepared.body, headers={"x-request-id": "r1"}, connect_timeout_s=1)
    )


def test_requests_are_signed_for_bedrock_in_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**AWS, "AWS_SESSION_TOKEN": "session-token"}.items():
        monkeypatch.setenv(name, value)
    upstream = provider(body={"output": {"message": {"content": []}}})
    send(upstream, stream=True)
    transport = upstream.transport
    assert isinstance(transport, MockTransport)
    (request,) = transport.requests
    assert request.endpoint == "/model/anthropic.claude-v2%3A1/converse-stream"
    assert request.body == {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    auth = request.headers["Authorization"]
    assert (
        auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDUNIT/") and "/us-west-2/bedrock/aws4_request" in auth
    )
    assert "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token," in auth
    assert request.headers["X-Amz-Security-Token"] == "session-token"
    assert request.headers["x-request-id"] == "r1"


def test_no_credentials_is_the_gateways_auth_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.setenv(name, AWS[name])
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    with pytest.raises(UpstreamError) as failed:
        send(provider())
    assert failed.value.failure == "upstream_auth_failed"
    assert "found no AWS credentials" in failed.value.message


@pytest.mark.parametrize(
    ("status", "kind", "seen", "failure"),
    [
        (429, "ThrottlingException", 429, "429"),
        (429, "ModelNotReadyException", 503, "503"),
        (408, "ModelTimeoutException", 504, "504"),
        (424, "ModelErrorException", 502, "502"),
        (503, "ServiceUnavailableException", 503, "503"),
        (400, "ValidationException", 400, "client_error"),
    ],
)
def test_errors_are_read_as_what_they_mean(
    monkeypatch: pytest.MonkeyPatch, status: int, kind: str, seen: int, failure: str
) -> None:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    upstream = provider(
        status, {"message": "why"}, {"x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/"}
    )
    resp = send(upstream)
    assert resp.status == seen and upstream.status_failure(resp.status) == failure
    error = orjson.loads(asyncio.run(resp.read()))["error"]
    assert error["message"] == f"{kind}: why" and error["code"] == kind


def test_error_named_only_in_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    resp = send(provider(400, {"__type": "com.amazon.coral.validate#ValidationException", "message": "bad"}))
    assert orjson.loads(asyncio.run(resp.read()))["error"]["code"] == "ValidationException"


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"x-amzn-ErrorType": "AccessDeniedException:http://internal.amazon.com/coral/"}, {"message": "no"}),
        ({}, {"__type": "com.amazon.coral.service#UnrecognizedClientException", "message": "AKID..."}),
    ],
)
def test_refused_credentials_are_the_gateways_fault_naming_aws(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str], body: dict[str, str]
) -> None:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UpstreamError) as failed:
        send(provider(403, body, headers))
    assert failed.value.failure == "upstream_auth_failed"
    assert "check the gateway's AWS credentials" in failed.value.message
    assert "bedrock:InvokeModel on anthropic.claude-v2:1" in failed.value.message
    assert "AKID" not in failed.value.message


@pytest.mark.parametrize(
    ("model", "setting", "expected"),
    [
        ("anthropic.claude-3-5-haiku-20241022-v1:0", "", True),
        ("us.amazon.nova-lite-v1:0", "", True),
        ("meta.llama3-1-70b-instruct-v1:0", "", False),
        ("mistral.mistral-large-2407-v1:0", "", False),
        ("meta.llama3-1-70b-instruct-v1:0", ", cache_breakpoints: true", True),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", ", cache_breakpoints: false", False),
    ],
)
def test_cache_points_by_default_only_where_the_model_caches(
    model: str, setting: str, expected: bool
) -> None:
    deployment = parse(f'{{provider: bedrock, model: "{model}", bedrock: {{region: us-east-1}}{setting}}}')
    assert BedrockProvider("b", deployment).places_cache_points is expected


def streaming(chunks: list[bytes]) -> BedrockProvider:
    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse(200, {"Content-Type": "application/vnd.amazon.eventstream"}, chunks)

    deployment = parse('{provider: bedrock, model: "anthropic.claude-v2:1", bedrock: {region: us-west-2}}')
    return BedrockProvider("b", deployment, transport=MockTransport(answer))


@pytest.mark.parametrize(
    ("name", "status", "failure"),
    [
        ("throttlingException", 429, "429"),
        ("serviceUnavailableException", 503, "503"),
        ("modelStreamErrorException", 502, "502"),
        ("validationException", 400, "client_error"),
        ("internalServerException", 500, "500"),
    ],
)
def test_a_stream_opening_with_an_exception_is_that_error(
    monkeypatch: pytest.MonkeyPatch, name: str, status: int, failure: str
) -> None:
    for key, value in AWS.items():
        monkeypatch.setenv(key, value)
    frame = exception(name, "no luck")
    upstream = streaming([frame[:7], frame[7:]])
    resp = send(upstream, stream=True)
    assert resp.status == status and upstream.status_failure(resp.status) == failure
    error = orjson.loads(asyncio.run(resp.read()))["error"]
    assert error["code"] == name[0].upper() + name[1:] and error["message"].endswith(": no luck")


def test_a_stream_that_opens_well_is_passed_on_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in AWS.items():
        monkeypatch.setenv(key, value)
    frames = [event("messageStart", {"role": "assistant"}), event("metadata", {"usage": {}})]
    data = b"".join(frames)
    chunks = [data[:5], data[5:30], data[30:]]

    async def run() -> list[bytes]:
        upstream = streaming(chunks)
        prepared = upstream.prepare(
            {"model": "b", "messages": [{"role": "user", "content": "hi"}]}, stream=True, hints=None
        )
        resp = await upstream.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=1)
        assert resp.status == 200
        return [chunk async for chunk in resp.iter_chunks()]

    assert asyncio.run(run()) == chunks


def test_the_documented_policy_snippet_is_valid() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "providers.md").read_text()
    section = text.split("## AWS Bedrock", 1)[1]
    snippet = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    tiers = "tiers: {fast: [claude-bedrock], strong: [claude-bedrock]}\n"
    policy = parse_policy(snippet + tiers, "providers.md", env={})
    deployment = policy.deployments["claude-bedrock"]
    assert deployment.bedrock is not None and deployment.bedrock.profile == "prod"
    assert deployment.base_url == deployment.bedrock.endpoint_url


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"output": []}', b'{"output": {"message": "hi"}}'])
def test_a_200_that_is_no_converse_answer_fails_the_attempt(body: bytes) -> None:
    with pytest.raises(UpstreamError) as failed:
        provider().read_answer(body, "application/json", None)
    assert failed.value.failure in ("empty_answer", "invalid_answer")
