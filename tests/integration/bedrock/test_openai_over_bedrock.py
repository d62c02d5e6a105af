"""The official SDKs through a real gateway to a Bedrock deployment (the fake runtime of
tests/fixtures/fake_bedrock.py, which checks every SigV4 signature): chat completions
translated to Converse and back, stream and not, tools, structured output, errors, cached
tokens, throttling retried; /v1/messages and /v1/responses over the same deployment."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.config import parse_policy
from gateway.providers.bedrock import BedrockProvider
from tests.fixtures.fake_bedrock import ACCESS_KEY, REGION, SECRET_KEY, TOOL_ARGUMENTS, FakeBedrock
from tests.helpers import GatewayProcess

MODEL_ID = "anthropic.claude-3-5-haiku-20241022-v1:0"
SYSTEM = "You are the dispatcher of a small harbor; answer tersely and name the berth. " * 60
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "berth",
            "description": "Assign a berth",
            "parameters": {"type": "object", "properties": {"berth": {"type": "string"}}},
        },
    }
]
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    # Nothing else of the machine's AWS set-up may leak in, and no instance-role lookup.
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def policy(fake: FakeBedrock) -> str:
    return f"""
deployments:
  claude-bedrock:
    provider: bedrock
    model: "{MODEL_ID}"
    bedrock: {{region: {REGION}, endpoint_url: "{fake.url}"}}
    price: {{input: 0.8, cached_input: 0.08, output: 4.0}}
tiers: {{strong: [claude-bedrock], fast: [claude-bedrock]}}
dispatch:
  retries: {{max: 2, backoff: {{base_s: 10ms, max_s: 50ms}}, budget: {{ratio: 10, min_per_s: 100}}}}
  circuit: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeBedrock]:
    with FakeBedrock() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    fake: FakeBedrock, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("bedrock-gw")
    gw = GatewayProcess(policy(fake), redis_url=redis_url, workdir=workdir, env=AWS_ENV)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess, fake: FakeBedrock) -> Iterator[openai.OpenAI]:
    fake.reset()
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=15) as c:
        yield c


def test_signed_answer_with_system_prompt_and_inference_config(
    client: openai.OpenAI, fake: FakeBedrock
) -> None:
    reply = client.chat.completions.create(
        model="claude-bedrock",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which berth?"}],
        max_tokens=32,
        temperature=0.3,
        top_p=0.9,
        stop=["zz"],
    )
    assert reply.choices[0].message.content == "echo: Which berth?"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == MODEL_ID
    sent = fake.requests[-1]
    assert sent["path"] == "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    assert sent["body"]["system"] == [{"text": "Be brief."}]
    assert sent["body"]["inferenceConfig"] == {
        "maxTokens": 32,
        "temperature": 0.3,
        "topP": 0.9,
        "stopSequences": ["zz"],
    }
    assert sent["headers"]["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    assert fake.rejected_signatures == 0


def test_stream_text_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="claude-bedrock",
        messages=[{"role": "user", "content": "Where does the ferry go tonight?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: Where does the ferry go tonight?"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_tool_calls_stream_byte_faithful_and_tool_results_in_order(
    client: openai.OpenAI, fake: FakeBedrock
) -> None:
    stream = client.chat.completions.create(
        model="claude-bedrock",
        messages=[{"role": "user", "content": "Berth the ferry."}],
        tools=TOOLS,
        tool_choice="required",
        stream=True,
    )
    chunks = list(stream)
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "berth" and calls[0][0].id == "tooluse_fake01"
    arguments = "".join(call[0].function.arguments or "" for call in calls)
    assert arguments == "".join(TOOL_ARGUMENTS)  # as the model wrote them: spacing, 12.50
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]
    assert fake.requests[-1]["body"]["toolConfig"]["toolChoice"] == {"any": {}}

    reply = client.chat.completions.create(
        model="claude-bedrock",
        messages=[
            {"role": "user", "content": "Berth the ferry."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "tooluse_fake01",
                        "type": "function",
                        "function": {"name": "berth", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "tooluse_fake01", "content": "north-7 is free"},
            {"role": "user", "content": "Thanks"},
        ],
        tools=TOOLS,
    )
    assert reply.choices[0].message.content == "echo: Thanks"
    messages = fake.requests[-1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0]["toolUse"]["input"] == json.loads(arguments)
    assert messages[2]["content"][0]["toolResult"] == {
        "toolUseId": "tooluse_fake01",
        "content": [{"text": "north-7 is free"}],
    }


def test_non_stream_tool_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="claude-bedrock",
        messages=[{"role": "user", "content": "Berth it."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "berth"}},
    )
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "berth"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == json.loads("".join(TOOL_ARGUMENTS))  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


def test_structured_output_through_converse_output_config(client: openai.OpenAI, fake: FakeBedrock) -> None:
    schema = {"type": "object", "properties": {"berth": {"type": "string"}, "tugs": {"type": "integer"}}}
    reply = client.chat.completions.create(
        model="claude-bedrock",
        messages=[{"role": "user", "content": "Plan the ferry."}],
        response_format={"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"berth": "harbor", "tugs": 7}
    text_format = fake.requests[-1]["body"]["outputConfig"]["textFormat"]
    assert text_format["type"] == "json_schema"
    assert json.loads(text_format["structure"]["jsonSchema"]["schema"]) == schema


def test_cached_tokens_from_cache_points_the_gateway_placed(client: openai.OpenAI, fake: FakeBedrock) -> None:
    replies = [
        client.chat.completions.create(
            model="claude-bedrock",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        )
        for question in ("Which berth for the ferry?", "Which berth for the tug?")
    ]
    first, second = (r.usage for r in replies)
    assert first is not None and second is not None
    assert first.prompt_tokens_details is not None and second.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0
    written = getattr(first.prompt_tokens_details, "cache_write_tokens", None)
    assert written and written > 1000
    assert second.prompt_tokens_details.cached_tokens == written
    system = fake.requests[-1]["body"]["system"]
    assert system[-1] == {"cachePoint": {"type": "default"}}


def test_unsupported_parameters_are_a_clear_400(client: openai.OpenAI, fake: FakeBedrock) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="claude-bedrock", messages=[{"role": "user", "content": "x"}], n=2
        )
    assert bad.value.code == "unsupported_parameter"
    assert "Bedrock deployments" in bad.value.message
    assert fake.requests == []


def test_validation_exception_is_the_clients_400(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("validation")
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "x"}])
    assert "ValidationException: messages.0.content: text field is blank" in bad.value.message
    assert len(fake.requests) == 1  # the client's mistake is not retried


def test_throttling_is_retried_after_a_backoff(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("throttle", 2)
    raw = client.chat.completions.with_raw_response.create(
        model="claude-bedrock", messages=[{"role": "user", "content": "again"}]
    )
    assert raw.parse().choices[0].message.content == "echo: again"
    assert raw.headers["x-switchyard-attempts"] == "3"
    assert len(fake.requests) == 3


def test_throttling_past_the_retries_is_a_429(
    client: openai.OpenAI, fake: FakeBedrock, gateway: GatewayProcess
) -> None:
    fake.fail_next("throttle", 3)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "x"}])
    # The client gets the plain message; Bedrock's own exception is in the log line (#50 item 8).
    assert "rate limited" in limited.value.message and "ThrottlingException" not in limited.value.message
    line = gateway.wait_log(lambda e: e.get("status") == 429 and e.get("error_detail"))
    assert "ThrottlingException" in line["error_detail"]


def test_model_not_ready_is_a_retried_503(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("not_ready", 3)
    with pytest.raises(openai.InternalServerError) as unavailable:
        client.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "x"}])
    assert unavailable.value.status_code == 503
    assert len(fake.requests) == 3


def test_access_denied_is_the_gateways_fault(
    client: openai.OpenAI, fake: FakeBedrock, gateway: GatewayProcess
) -> None:
    fake.fail_next("denied")
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 502
    assert failed.value.code == "upstream_auth_failed"
    assert "credentials" in failed.value.message and "AccessDeniedException" not in failed.value.message
    # The operator's hint (which AWS permission) is in the log line, not in the client's message.
    line = gateway.wait_log(lambda e: e.get("error_code") == "upstream_auth_failed" and e.get("error_detail"))
    assert "AccessDeniedException" in line["error_detail"] and "bedrock:InvokeModel" in line["error_detail"]


def test_stream_exception_before_the_first_event_is_retried(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("stream_throttle")
    stream = client.chat.completions.create(
        model="claude-bedrock", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: hello"
    assert len(fake.requests) == 2


def test_stream_throttled_past_the_retries_is_a_429(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("stream_throttle", 3)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(
            model="claude-bedrock", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert "rate limited" in limited.value.message and "Too many tokens" not in limited.value.message
    assert len(fake.requests) == 3


def test_corrupt_first_frame_is_retried_never_a_success(client: openai.OpenAI, fake: FakeBedrock) -> None:
    fake.fail_next("corrupt_first")
    stream = client.chat.completions.create(
        model="claude-bedrock", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: hello"
    assert len(fake.requests) == 2


@pytest.mark.parametrize("fault", ["stream_broken", "corrupt_mid"])
def test_stream_broken_after_it_started_ends_with_an_error_event(
    client: openai.OpenAI, fake: FakeBedrock, fault: str
) -> None:
    fake.fail_next(fault)
    stream = client.chat.completions.create(
        model="claude-bedrock", messages=[{"role": "user", "content": "hello there"}], stream=True
    )
    text = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            text.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(text).startswith("echo: ")


def test_messages_endpoint_over_bedrock(gateway: GatewayProcess, fake: FakeBedrock) -> None:
    fake.reset()
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=15) as client:
        message = client.messages.create(
            model="claude-bedrock",
            max_tokens=64,
            system="Be brief.",
            messages=[{"role": "user", "content": "Name a berth."}],
        )
        assert message.content[0].type == "text" and message.content[0].text == "echo: Name a berth."
        assert message.stop_reason == "end_turn"
        with client.messages.stream(
            model="claude-bedrock", max_tokens=64, messages=[{"role": "user", "content": "Stream it."}]
        ) as stream:
            assert "".join(stream.text_stream) == "echo: Stream it."
    assert fake.requests[0]["body"]["system"] == [{"text": "Be brief."}]


def test_responses_endpoint_over_bedrock(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="claude-bedrock", input="Which berth?", instructions="Be brief.", store=False
    )
    assert response.output_text == "echo: Which berth?"
    assert response.usage is not None and response.usage.output_tokens == 9
    events = list(
        client.responses.create(model="claude-bedrock", input="Stream it.", stream=True, store=False)
    )
    done = [e for e in events if e.type == "response.completed"]
    assert done and done[0].response.output_text == "echo: Stream it."


def _signed_post(fake: FakeBedrock, secret: str, signed_body: bytes, sent_body: bytes) -> tuple[int, str]:
    url = f"{fake.url}/model/{MODEL_ID.replace(':', '%3A')}/converse"
    request = AWSRequest("POST", url, data=signed_body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(ACCESS_KEY, secret), "bedrock", REGION).add_auth(request)
    post = urllib.request.Request(url, data=sent_body, method="POST", headers=dict(request.headers.items()))
    try:
        with urllib.request.urlopen(post, timeout=10) as resp:
            return resp.status, resp.headers.get("x-amzn-ErrorType", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("x-amzn-ErrorType", "")


def test_the_fake_refuses_a_wrong_secret_and_a_changed_body(fake: FakeBedrock) -> None:
    """The signature check the other tests rely on can fail."""
    fake.reset()
    body = b'{"messages":[{"role":"user","content":[{"text":"hi"}]}]}'
    assert _signed_post(fake, SECRET_KEY, body, body)[0] == 200
    status, kind = _signed_post(fake, "not-the-secret", body, body)
    assert status == 403 and kind.startswith("InvalidSignatureException")
    status, kind = _signed_post(fake, SECRET_KEY, body, body.replace(b"hi", b"ho"))
    assert status == 403 and kind.startswith("InvalidSignatureException")
    assert fake.rejected_signatures == 2


@pytest.mark.parametrize("upstream_client", ["http1", "aiohttp"])
def test_both_upstream_clients_send_what_was_signed(
    fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch, upstream_client: str
) -> None:
    """A model id with ':' (%3A in the path) and an ARN-like one with '/' reach the runtime as signed."""
    for name, value in {**AWS_ENV, "SWITCHYARD_UPSTREAM_CLIENT": upstream_client}.items():
        monkeypatch.setenv(name, value)
    fake.reset()

    async def one(model: str) -> int:
        deployment = parse_policy(
            f'deployments:\n  b: {{provider: bedrock, model: "{model}", bedrock: {{region: {REGION}, endpoint_url: "{fake.url}"}}}}\n'
            "tiers: {fast: [b], strong: [b]}\n",
            "t.yaml",
        ).deployments["b"]
        provider = BedrockProvider("b", deployment)
        prepared = provider.prepare(
            {"model": "b", "messages": [{"role": "user", "content": "hi"}]}, stream=False, hints=None
        )
        try:
            resp = await provider.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=5)
            await resp.read()
            return resp.status
        finally:
            await provider.close()

    assert asyncio.run(one(MODEL_ID)) == 200
    assert (
        asyncio.run(one("arn:aws:bedrock:us-west-2:123456789012:inference-profile/us.anthropic.claude-x"))
        == 200
    )
    assert fake.rejected_signatures == 0
