"""The anthropic provider: chat completions to the Messages API and back, over MockTransport."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.cachestats.cost import cost_usd
from gateway.config import parse_policy
from gateway.errors import InvalidRequestError, UpstreamError
from gateway.policy import Deployment, Price
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import CacheHints
from gateway.providers.mock import MockRequest, MockResponse, MockTransport


def deployment(extra: str = "") -> Deployment:
    policy = parse_policy(
        "deployments:\n"
        f'  c: {{provider: anthropic, base_url: "http://a/v1", model: claude-x, api_key_env: ANT_KEY{extra}}}\n'
        "tiers: {fast: [c], strong: [c]}\n",
        "t.yaml",
    )
    return policy.deployments["c"]


MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
    ],
    "stop_reason": "tool_use",
    "usage": {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 200,
    },
}


def provider(handler: Any = None, extra: str = "") -> tuple[AnthropicProvider, MockTransport]:
    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse.json(MESSAGE)

    transport = MockTransport(handler or answer)
    return AnthropicProvider("c", deployment(extra), transport=transport), transport


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [f"event: {e['type']}\ndata: ".encode() + orjson.dumps(e) + b"\n\n" for e in events]


def test_request_translation_system_images_tools_and_results() -> None:
    p, _ = provider()
    body = {
        "model": "fast",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
        "stop": "END",
        "temperature": 0.2,
    }
    out = p.prepare(body, stream=False, hints=None).body
    assert out["model"] == "claude-x" and out["max_tokens"] == 4096
    assert out["system"] == [{"type": "text", "text": "Be brief."}]
    assert out["messages"][0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    assert out["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "x"}}
    ]
    assert out["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "found"}],
    }
    assert out["tools"] == [{"name": "lookup", "input_schema": {"type": "object"}}]
    assert (
        out["tool_choice"] == {"type": "any"}
        and out["stop_sequences"] == ["END"]
        and out["temperature"] == 0.2
    )


def test_json_schema_becomes_structured_output_else_a_clear_400() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    p, _ = provider()
    assert p.prepare(body, stream=False, hints=None).body["output_config"] == {
        "format": {"type": "json_schema", "schema": {"type": "object"}}
    }
    off, _ = provider(extra=", structured_outputs: false")

    async def refused() -> None:
        prepared = off.prepare(body, stream=False, hints=None)
        await off.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=None)

    with pytest.raises(InvalidRequestError) as exc:
        asyncio.run(refused())
    assert exc.value.param == "response_format" and exc.value.status == 400


def test_send_uses_the_messages_endpoint_and_answer_maps_back_with_cache_usage() -> None:
    p, transport = provider()

    async def run() -> Any:
        prepared = p.prepare(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, stream=False, hints=None
        )
        resp = await p.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=None)
        return p.read_answer(await resp.read(), "application/json", None)

    answer = asyncio.run(run())
    assert transport.requests[0].endpoint == "/messages"
    chat = orjson.loads(answer.body)
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me look."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q":"x"}'}
    assert answer.usage == {
        "prompt_tokens": 1210,
        "completion_tokens": 5,
        "total_tokens": 1215,
        "prompt_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 200},
    }


def test_cost_charges_reads_at_cached_price_and_writes_at_their_premium() -> None:
    price = Price(input=3.0, cached_input=0.3, output=15.0)
    usage = {
        "prompt_tokens": 1210,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 200},
    }
    assert cost_usd(price, usage) == pytest.approx(
        (10 * 3.0 + 200 * 3.0 * 1.25 + 1000 * 0.3 + 5 * 15.0) / 1e6
    )
    usage["prompt_tokens_details"]["cache_write_1h_tokens"] = 200  # type: ignore[index]
    assert cost_usd(price, usage) == pytest.approx((10 * 3.0 + 200 * 3.0 * 2.0 + 1000 * 0.3 + 5 * 15.0) / 1e6)


def test_key_goes_in_x_api_key_with_anthropic_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANT_KEY", "sk-ant-test")
    p = AnthropicProvider("c", deployment())
    headers = p.transport._headers  # type: ignore[attr-defined]
    assert headers["x-api-key"] == "sk-ant-test" and headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in headers


def test_529_is_an_overload_and_429_a_rate_limit() -> None:
    p, _ = provider()
    assert [p.status_failure(s) for s in (529, 429, 401, 400, 500)] == [
        "503",
        "429",
        "upstream_auth_failed",
        "client_error",
        "500",
    ]


def test_stream_events_become_openai_chunks_with_tool_argument_deltas() -> None:
    p, _ = provider()
    scanner = p.scanner(strip_usage=False, shown_model="c")
    events = sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "model": "claude-x",
                "usage": {"input_tokens": 7, "cache_read_input_tokens": 3},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a":'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": " 1}"},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    )
    raw = b"".join(events)
    # Bytes arrive cut anywhere: the scanner only forwards complete events.
    out = b"".join(scanner.feed(raw[i : i + 37]) for i in range(0, len(raw), 37))
    assert scanner.done and out.endswith(b"data: [DONE]\n\n")
    chunks = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "Hi"}
    assert deltas[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[3:5])
    assert args == '{"a": 1}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] == 10 and chunks[-1]["usage"]["completion_tokens"] == 9
    assert all(c["model"] == "c" for c in chunks)


def test_stream_usage_is_kept_but_not_forwarded_when_the_client_did_not_ask() -> None:
    p, _ = provider()
    prepared = p.prepare(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, stream=True, hints=None
    )
    assert prepared.strip_usage and prepared.body["stream"] is True
    scanner = p.scanner(strip_usage=True, shown_model=None)
    out = b"".join(
        scanner.feed(e)
        for e in sse(
            {
                "type": "message_start",
                "message": {"id": "m", "model": "claude-x", "usage": {"input_tokens": 2}},
            },
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
            {"type": "message_stop"},
        )
    )
    assert b'"usage"' not in out and scanner.usage is not None and scanner.usage["prompt_tokens"] == 2


def test_stream_error_event_and_malformed_event() -> None:
    p, _ = provider()
    scanner = p.scanner(strip_usage=False, shown_model=None)
    out = scanner.feed(
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        + b"\n\n"
    )
    assert scanner.error == {
        "message": "Overloaded",
        "type": "overloaded_error",
        "param": None,
        "code": "overloaded_error",
    }
    assert b"Overloaded" in out and not scanner.done
    bad = p.scanner(strip_usage=False, shown_model=None)
    bad.feed(b"event: content_block_delta\ndata: {not json\n\n")
    assert bad.malformed is not None


def test_gateway_breakpoints_from_the_stable_prefix_keep_the_clients_own() -> None:
    p, _ = provider(extra=", min_cache_tokens: 10")
    stable = "You are a support agent. " * 20
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": stable + "\nToday is 2026-12-03."},
            {"role": "user", "content": "first question " * 5},
            {"role": "assistant", "content": "first answer"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "second", "cache_control": {"type": "ephemeral"}}],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }
    hints = CacheHints("h", len(stable), 0, prompt_cache_key=True)
    out = p.prepare(body, stream=False, hints=hints).body
    assert out["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert out["system"][0] == {"type": "text", "text": stable, "cache_control": {"type": "ephemeral"}}
    assert "cache_control" not in out["system"][1]
    assert out["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # previous turn
    marks = orjson.dumps(out).count(b"cache_control")
    assert marks == 4  # tools, system, previous turn + the client's own on the last message
    assert body["messages"][0]["content"].endswith("2026-12-03.")  # the client's body is untouched


def _without_marks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_marks(v) for v in value]
    return value


def test_the_last_message_mark_skips_what_shaping_put_after_the_newest_turn() -> None:
    # Shaping (placement after_last_turn) puts a value that changes every request after the
    # newest turn; the translator makes it the last text block of the last user turn. The
    # mark that writes the cache for the next turn must end before it, or the next turn
    # (which no longer has that block there) never reads what was written.
    p, _ = provider(extra=", min_cache_tokens: 10")
    system = {"role": "system", "content": "You are a support agent. " * 20}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "first question " * 5},
        {"role": "assistant", "content": "first answer " * 5},
        {"role": "user", "content": "second question " * 5},
    ]

    def turn(messages: list[dict[str, Any]], now: str) -> dict[str, Any]:
        body = {"model": "m", "messages": [system, *messages, {"role": "system", "content": now}]}
        return dict(p.prepare(body, stream=False, hints=CacheHints("h", 0, 0, False)).body)

    first = turn(history, "Now: 12:00:01")
    last = first["messages"][-1]["content"]
    assert last[-1] == {"type": "text", "text": "Now: 12:00:01"} and "cache_control" not in last[-1]
    assert last[-2]["cache_control"] == {"type": "ephemeral"}
    second = turn([*history, {"role": "assistant", "content": "second answer"}], "Now: 12:00:09")
    written = _without_marks([*first["messages"][:-1], {"role": "user", "content": last[:-1]}])
    assert _without_marks(second["messages"][: len(written)]) == written  # read back next turn


def test_a_529_reaches_dispatch_as_a_503_with_anthropics_body() -> None:
    async def overloaded(request: MockRequest) -> MockResponse:
        return MockResponse.json(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, 529
        )

    p, _ = provider(overloaded)

    async def run() -> tuple[int, bytes]:
        prepared = p.prepare(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]}, stream=False, hints=None
        )
        resp = await p.send("/chat/completions", prepared.body, headers={}, connect_timeout_s=None)
        return resp.status, await resp.read()

    status, body = asyncio.run(run())
    assert status == 503 and b"overloaded_error" in body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty_answer"),
        (b'{"type": "message", "content": [{"type": "te', "invalid_answer"),
        (
            b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
            "error_answer",
        ),
        (b'{"type": "completion"}', "invalid_answer"),
    ],
)
def test_a_200_that_is_no_message_fails_like_a_5xx(body: bytes, reason: str) -> None:
    provider = AnthropicProvider("claude", deployment())
    with pytest.raises(UpstreamError) as info:
        provider.read_answer(body, "application/json", None, endpoint="/chat/completions")
    assert info.value.failure == reason
