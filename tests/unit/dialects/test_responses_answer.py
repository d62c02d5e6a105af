"""Chat answers as Responses: the whole object, the typed event stream, usage both ways."""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.responses import Response

from gateway.dialects.responses.answer import from_chat
from gateway.dialects.responses.native import NativeResponsesScanner
from gateway.dialects.responses.stream import ChatToResponsesScanner
from gateway.dialects.responses.wire import chat_usage, responses_usage
from gateway.errors import UpstreamError
from gateway.providers.sse import StreamScanner

USAGE = {
    "prompt_tokens": 10,
    "completion_tokens": 3,
    "total_tokens": 13,
    "prompt_tokens_details": {"cached_tokens": 8},
}
REQUEST = {"model": "m", "input": "hi", "instructions": "Be terse.", "metadata": {"k": "v"}}


def test_usage_with_cached_tokens_round_trips() -> None:
    usage = responses_usage(USAGE)
    assert usage is not None
    assert usage["input_tokens"] == 10 and usage["input_tokens_details"]["cached_tokens"] == 8
    assert usage["output_tokens"] == 3 and usage["total_tokens"] == 13
    assert chat_usage(usage) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_whole_answer_parses_as_the_sdk_response() -> None:
    message = {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    chat = {
        "model": "up",
        "created": 1,
        "choices": [{"message": message, "finish_reason": "length"}],
        "usage": USAGE,
    }
    response = Response.model_validate(from_chat(REQUEST, chat, "shown"))
    assert response.output_text == "Hello" and response.model == "shown"
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.output[1].type == "function_call" and response.output[1].call_id == "call_1"
    assert response.instructions == "Be terse." and response.metadata == {"k": "v"}


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: ")]


def test_stream_translates_text_and_tool_calls_into_typed_events() -> None:
    scanner = ChatToResponsesScanner(REQUEST, StreamScanner(), None)
    raw = _sse(
        {"model": "up", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
        {"model": "up", "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {
            "model": "up",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                }
            ],
        },
        {
            "model": "up",
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}}
            ],
        },
        {"model": "up", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"model": "up", "choices": [], "usage": USAGE},
    )
    # Fed in small pieces: events are never split.
    out = b"".join(scanner.feed(raw[i : i + 7]) for i in range(0, len(raw), 7))
    events = _events(out)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert scanner.done and scanner.usage == USAGE
    final = Response.model_validate(events[-1]["response"])
    assert (
        final.output_text == "Hello"
        and final.usage is not None
        and final.usage.input_tokens_details.cached_tokens == 8
    )
    assert events[12]["arguments"] == '{"a":1}'
    assert scanner.final_response == events[-1]["response"]
    err = _events(scanner.error_event(UpstreamError("cut", code="upstream_disconnected")))[0]
    assert err == {
        "type": "error",
        "sequence_number": len(events),
        "code": "upstream_disconnected",
        "message": "cut",
        "param": None,
    }


def test_upstream_error_in_stream_becomes_error_and_failed() -> None:
    scanner = ChatToResponsesScanner(REQUEST, StreamScanner(), None)
    raw = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: {"error":{"message":"boom","code":"x"}}\n\n'
    kinds = [e["type"] for e in _events(scanner.feed(raw))]
    assert kinds[-2:] == ["error", "response.failed"] and scanner.done


def test_native_scanner_ends_on_completed_and_reads_usage() -> None:
    usage = responses_usage(USAGE)
    completed = {
        "type": "response.completed",
        "sequence_number": 1,
        "response": {"id": "r", "model": "up", "usage": usage, "previous_response_id": None},
    }
    raw = (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"model":"up","previous_response_id":null}}\n\n'
        + b"event: response.completed\ndata: "
        + orjson.dumps(completed)
        + b"\n\n"
    )
    scanner = NativeResponsesScanner(model_from="up", model_to="shown", previous_response_id="resp_prev")
    out = scanner.feed(raw[:30]) + scanner.feed(raw[30:])
    assert (
        scanner.done
        and scanner.usage is not None
        and scanner.usage["prompt_tokens_details"] == {"cached_tokens": 8}
    )
    assert b'"model":"up"' not in out and b'"previous_response_id":"resp_prev"' in out
    assert scanner.final_response is not None and scanner.final_response["model"] == "shown"
    assert scanner.final_response["previous_response_id"] == "resp_prev"


def test_native_scanner_flags_a_malformed_event() -> None:
    scanner = NativeResponsesScanner()
    scanner.feed(b'event: response.created\ndata: {"type":"response.created"\n\n')
    assert scanner.malformed is not None


def test_native_scanner_flags_invalid_json_that_ends_like_an_object() -> None:
    scanner = NativeResponsesScanner()
    good = b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{}}\n\n'
    bad = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"x}\n\n'
    later = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"y"}\n\n'
    out = scanner.feed(good + bad)
    assert out == good  # the events before it are forwarded, the bad one is not
    assert scanner.malformed is not None and scanner.malformed.startswith(
        b"event: response.output_text.delta"
    )
    assert scanner.feed(later) == b""  # nor anything after it


def test_native_scanner_flags_an_event_whose_data_is_not_an_object() -> None:
    for data in (b"[1, 2]", b"null", b"}"):
        scanner = NativeResponsesScanner()
        scanner.feed(b"event: response.created\ndata: " + data + b"\n\n")
        assert scanner.malformed is not None, data


def test_native_scanner_passes_comments_and_multiline_data() -> None:
    scanner = NativeResponsesScanner()
    raw = b': keep-alive\n\nevent: response.created\ndata: {"type":\ndata: "response.created"}\n\n'
    assert scanner.feed(raw) == raw
    assert scanner.malformed is None and scanner.events == 1
