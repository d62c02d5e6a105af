"""Which HTTP client a deployment's requests go through."""

from __future__ import annotations

import pytest

from gateway.config import parse_policy
from gateway.policy import Deployment
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.clients import CLIENT_ENV, http_transport
from gateway.providers.http1 import Http1Transport
from gateway.providers.openai import OpenAIProvider
from gateway.providers.transport import HttpTransport


def deployment(provider: str = "openai") -> Deployment:
    policy = parse_policy(
        f'deployments:\n  d: {{provider: {provider}, base_url: "https://api.example.com/v1", model: m}}\n'
        "tiers: {fast: [d], strong: [d]}\n",
        "t.yaml",
    )
    return policy.deployments["d"]


def test_the_lean_client_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLIENT_ENV, raising=False)
    assert isinstance(OpenAIProvider("d", deployment()).transport, Http1Transport)
    assert isinstance(AnthropicProvider("d", deployment("anthropic")).transport, Http1Transport)


def test_aiohttp_stays_reachable_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLIENT_ENV, "aiohttp")
    assert isinstance(http_transport("http://x/v1", deployment()), HttpTransport)
    monkeypatch.setenv(CLIENT_ENV, "curl")  # unknown: logged, and the default used
    assert isinstance(http_transport("http://x/v1", deployment()), Http1Transport)


def test_the_request_head_is_built_once_with_the_host_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = Http1Transport("https://api.example.com/v1", deployment())
    head = transport._head("/chat/completions", {"x-request-id": "r"}, b"{}")
    assert head == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\n"
        b"Content-Type: application/json\r\nx-request-id: r\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert transport._port == 443 and transport._ssl is not None
