"""A request that lacks a required field gets a 400 that names that field as the endpoint
calls it (``input`` on /v1/responses, ``prompt`` on /v1/completions, ...), never the name
of what the gateway translates it to."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    policy = f"""
deployments:
  sim-chat: {{provider: vllm, base_url: "{sim.base_url}", model: sim-fast}}
  sim-native: {{provider: vllm, base_url: "{sim.base_url}", model: sim-fast, responses_api: native}}
tiers:
  fast: [sim-chat]
  strong: [sim-native]
"""
    gw = GatewayProcess(policy, redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw")).start()
    yield gw
    gw.stop()


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/responses", {"model": "sim-chat"}, "input"),
        ("/responses", {"model": "sim-native"}, "input"),
        ("/responses", {"model": "sim-chat", "input": None, "instructions": "Be terse."}, "input"),
        ("/responses", {"model": "sim-chat", "input": []}, "input"),
        ("/responses", {"input": "hi"}, "model"),
        ("/chat/completions", {"model": "sim-chat"}, "messages"),
        ("/completions", {"model": "sim-chat"}, "prompt"),
        ("/embeddings", {"model": "sim-chat"}, "input"),
    ],
)
def test_a_missing_field_is_named_as_the_endpoint_names_it(
    gateway: GatewayProcess, path: str, body: dict[str, Any], param: str
) -> None:
    status, answer = _post(gateway.base_url + path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    assert param in answer["error"]["message"]


def test_the_openai_sdk_sees_input_named_on_responses(gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0)
    for model in ("sim-chat", "sim-native"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=model, instructions="Be terse.")  # type: ignore[call-overload]
        assert info.value.param == "input"  # type: ignore[attr-defined]


# The anthropic SDK refuses these before sending: only a raw client can send them.
@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"model": "sim-chat", "max_tokens": 10}, "messages"),
        ({"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ],
)
def test_messages_names_its_own_fields(gateway: GatewayProcess, body: dict[str, Any], named: str) -> None:
    status, answer = _post(gateway.url + "/v1/messages", body)
    assert status == 400 and answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error" and named in answer["error"]["message"]
