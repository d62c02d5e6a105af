"""/v1/messages at the edge: Messages requests to chat completions, answers and streams back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.dialects.anthropic.inbound import error_object, to_chat_request, to_message
from gateway.dialects.anthropic.sse import ChunksToEvents
from gateway.errors import InvalidRequestError, ModelNotFoundError, UpstreamUnavailableError


def test_request_to_chat_keeps_cache_marks_and_orders_tool_results_first() -> None:
    body = {
        "model": "claude",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "look it up"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"q": 1}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and then?"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                ],
            },
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u1"},
        "stream": True,
    }
    chat = to_chat_request(body)
    assert chat["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    }
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"q":1}'}
    assert [m["role"] for m in chat["messages"][3:]] == ["tool", "user"]
    assert chat["tools"][0]["cache_control"] == {"type": "ephemeral"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["user"] == "u1"
    assert chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0"),
    ],
)
def test_bad_requests_are_400s(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        to_chat_request(body)
    assert exc.value.param == param


def test_answer_to_message_with_cache_usage() -> None:
    completion = {
        "id": "chatcmpl-1",
        "model": "sim",
        "choices": [
            {
                "message": {
                    "content": "hi",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 30},
        },
    }
    message = to_message(completion, "claude")
    assert message["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 60,
        "output_tokens": 3,
    }


def test_errors_in_anthropics_json() -> None:
    assert error_object(ModelNotFoundError("x"))["error"]["type"] == "not_found_error"
    assert error_object(UpstreamUnavailableError("busy"))["error"] == {
        "type": "overloaded_error",
        "message": "busy",
    }


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    obj = {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_chunks_become_messages_events() -> None:
    events = ChunksToEvents("claude")
    raw = (
        chunk({"role": "assistant", "content": ""})
        + chunk({"content": "Hel"})
        + chunk({"content": "lo"})
        + chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]})
        + chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]})
        + chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "tool_calls")
        + b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
        + b"data: [DONE]\n\n"
    )
    out = events.feed(raw[:50]) + events.feed(raw[50:])
    parsed = [orjson.loads(e.split(b"\ndata: ")[1]) for e in out.split(b"\n\n") if e]
    kinds = [p["type"] for p in parsed]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert parsed[5]["content_block"]["name"] == "f" and parsed[5]["index"] == 1
    assert "".join(p["delta"]["partial_json"] for p in parsed[6:8]) == '{"a":1}'
    assert parsed[9]["delta"]["stop_reason"] == "tool_use" and parsed[9]["usage"]["input_tokens"] == 5
    assert events.finished


def test_an_error_chunk_becomes_an_error_event() -> None:
    events = ChunksToEvents("claude")
    out = events.feed(b'data: {"error": {"message": "boom", "type": "overloaded_error"}}\n\n')
    assert b"event: error" in out and events.error == {"type": "overloaded_error", "message": "boom"}


def _events(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.split(b"\ndata: ")[1]) for e in out.split(b"\n\n") if e]


def test_a_matched_stop_string_is_stop_reason_stop_sequence() -> None:
    # vLLM names the stop string that ended the answer in the choice's stop_reason (the
    # anthropic provider fills it from Anthropic's stop_sequence); a token id is not one.
    def completion(stop_reason: Any) -> dict[str, Any]:
        choice = {"message": {"content": "Hi"}, "finish_reason": "stop", "stop_reason": stop_reason}
        return {"id": "chatcmpl-1", "choices": [choice]}

    said = to_message(completion("END"), "claude")
    assert (said["stop_reason"], said["stop_sequence"]) == ("stop_sequence", "END")
    for plain in (None, 128009):
        said = to_message(completion(plain), "claude")
        assert (said["stop_reason"], said["stop_sequence"]) == ("end_turn", None)
    events = ChunksToEvents("claude")
    out = events.feed(
        chunk({"content": "Hi"})
        + chunk(
            {}, "stop", choices=[{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]
        )
        + b"data: [DONE]\n\n"
    )
    delta = next(e for e in _events(out) if e["type"] == "message_delta")["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


@pytest.mark.parametrize(
    ("upstream_id", "shown"), [("msg_01abc", "msg_01abc"), ("chatcmpl-7", "msg_chatcmpl-7")]
)
def test_ids_are_prefixed_once(upstream_id: str, shown: str) -> None:
    assert to_message({"id": upstream_id, "choices": [{"message": {"content": "x"}}]}, "m")["id"] == shown
    events = ChunksToEvents("m")
    out = events.feed(chunk({"content": "x"}, id=upstream_id) + b"data: [DONE]\n\n")
    assert _events(out)[0]["message"]["id"] == shown


def test_message_start_carries_the_usage_the_upstream_started_with() -> None:
    events = ChunksToEvents("m")
    events.start_usage = {"input_tokens": 12, "cache_read_input_tokens": 1000, "output_tokens": 1}
    out = events.feed(chunk({"content": "x"}))
    assert _events(out)[0]["message"]["usage"] == events.start_usage
