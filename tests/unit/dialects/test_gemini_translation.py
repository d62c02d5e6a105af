"""Chat completions <-> Gemini ``generateContent``: schemas, messages and tool calls in order,
generation config, refusals, finish reasons, usage, the stream."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dialects.gemini.request import call_signature, make_call_id, to_generate_request
from gateway.dialects.gemini.response import (
    GeminiStreamScanner,
    error_details,
    openai_usage,
    seconds,
    to_chat_completion,
)
from gateway.dialects.gemini.schema import gemini_schema
from gateway.errors import InvalidRequestError

SIGNATURE = "CiQB0e2Kb+/fR3zz9a8="


def test_schema_keeps_supported_keywords_and_declared_order() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "minLength": 3, "pattern": "^a"},
            "pattern": {"const": "fixed"},
            "items": {"type": "array", "items": {"type": "object", "properties": {"b": {}, "a": {}}}},
            "choice": {"anyOf": [{"type": "string", "default": "x"}, {"type": "null"}]},
        },
        "required": ["reasoning"],
        "additionalProperties": False,
        "strict": True,
    }
    before = copy.deepcopy(schema)
    out = gemini_schema(schema)
    assert schema == before
    assert out == {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string"},
            "pattern": {"enum": ["fixed"]},  # a property named like a keyword stays
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"b": {}, "a": {}}, "propertyOrdering": ["b", "a"]},
            },
            "choice": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["reasoning"],
        "additionalProperties": False,
        "propertyOrdering": ["reasoning", "pattern", "items", "choice"],
    }


def test_schema_keeps_a_given_property_ordering() -> None:
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "propertyOrdering": ["b", "a"]}
    assert gemini_schema(schema)["propertyOrdering"] == ["b", "a"]


def test_call_id_carries_a_thought_signature_both_ways() -> None:
    call_id = make_call_id(SIGNATURE)
    assert call_id.startswith("call_") and "+" not in call_id and "/" not in call_id and "=" not in call_id
    assert call_signature(call_id) == SIGNATURE
    plain = make_call_id()
    assert len(plain) == 21 and call_signature(plain) is None
    assert call_signature("toolu_01abc") is None and call_signature(None) is None


def test_messages_tool_calls_and_results_in_order() -> None:
    signed = make_call_id(SIGNATURE)
    body = {
        "messages": [
            {"role": "system", "content": "Rules."},
            {"role": "developer", "content": [{"type": "text", "text": "More rules."}]},
            {"role": "user", "content": "Weather in A and B?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": signed,
                        "type": "function",
                        "function": {"name": "w", "arguments": '{"z": 1, "a": [2.50, "x"]}'},
                    },
                    {"id": "call_2", "type": "function", "function": {"name": "v", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "cloudy"},
            {"role": "tool", "tool_call_id": signed, "content": [{"type": "text", "text": "sunny"}]},
            {"role": "system", "content": "Today is Monday."},
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
            },
        ]
    }
    out = to_generate_request(body)
    assert out["systemInstruction"] == {"parts": [{"text": "Rules."}, {"text": "More rules."}]}
    user, model, results = out["contents"]
    assert user == {"role": "user", "parts": [{"text": "Weather in A and B?"}]}
    assert model["role"] == "model"
    assert model["parts"] == [
        {"text": "Checking."},
        {"functionCall": {"name": "w", "args": {"z": 1, "a": [2.5, "x"]}}, "thoughtSignature": SIGNATURE},
        {"functionCall": {"name": "v", "args": {}}},
    ]
    assert list(model["parts"][1]["functionCall"]["args"]) == ["z", "a"]
    # Results in the client's order, the late system text and the image in the same user turn.
    assert results == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "v", "response": {"output": "cloudy"}}},
            {"functionResponse": {"name": "w", "response": {"output": "sunny"}}},
            {"text": "Today is Monday."},
            {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
        ],
    }


def test_generation_config_tools_and_formats() -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 50,
        "top_p": 0.9,
        "n": 2,
        "stop": "END",
        "presence_penalty": 0.5,
        "response_format": {"type": "json_object"},
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "u1",
    }
    out = to_generate_request(body)
    assert out["generationConfig"] == {
        "maxOutputTokens": 50,
        "topP": 0.9,
        "candidateCount": 2,
        "presencePenalty": 0.5,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
    }
    assert out["tools"] == [{"functionDeclarations": [{"name": "f"}]}]
    assert out["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert set(out) == {"contents", "generationConfig", "tools", "toolConfig"}
    body["tool_choice"] = "none"
    assert to_generate_request(body)["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"modalities": ["text", "audio"]}, "audio"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
    ],
)
def test_unsupported_parameters_are_refused(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        to_generate_request({"messages": [{"role": "user", "content": "x"}], **extra})
    assert refused.value.code == "unsupported_parameter" and refused.value.param == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"tools": 5}, "tools"), ({"stop": 5}, "stop"), ({"tool_choice": "maybe", "tools": []}, None)],
)
def test_malformed_fields_are_a_400_not_a_traceback(extra: dict[str, Any], param: str | None) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], **extra}
    if param is None:
        assert "toolConfig" not in to_generate_request(body)  # no tools: tool_choice is moot
        return
    with pytest.raises(InvalidRequestError) as refused:
        to_generate_request(body)
    assert refused.value.param == param


def test_a_tool_result_for_an_unknown_call_is_a_400() -> None:
    with pytest.raises(InvalidRequestError, match="follows no assistant tool call"):
        to_generate_request({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]})


@pytest.mark.parametrize(
    ("reason", "calls", "expected"),
    [
        ("STOP", False, "stop"),
        ("STOP", True, "tool_calls"),
        ("MAX_TOKENS", False, "length"),
        ("SAFETY", False, "content_filter"),
        ("RECITATION", False, "content_filter"),
        ("BLOCKLIST", False, "content_filter"),
        ("PROHIBITED_CONTENT", False, "content_filter"),
        ("SPII", False, "content_filter"),
        ("MALFORMED_FUNCTION_CALL", False, "stop"),
    ],
)
def test_finish_reasons(reason: str, calls: bool, expected: str) -> None:
    parts: list[Any] = [{"text": "hi"}]
    if calls:
        parts.append({"functionCall": {"name": "f", "args": {}}})
    answer = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": reason}]}
    assert to_chat_completion(answer, "m")["choices"][0]["finish_reason"] == expected


def test_answer_with_thoughts_calls_and_usage() -> None:
    answer = {
        "responseId": "r1",
        "modelVersion": "gemini-2.5-pro",
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "thinking...", "thought": True},
                        {"text": "Sure."},
                        {
                            "functionCall": {"name": "f", "args": {"b": 1, "a": 2}},
                            "thoughtSignature": SIGNATURE,
                        },
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 1200,
            "cachedContentTokenCount": 1024,
            "candidatesTokenCount": 20,
            "thoughtsTokenCount": 30,
            "totalTokenCount": 1250,
        },
    }
    completion = to_chat_completion(answer, None)
    assert completion["id"] == "chatcmpl-r1" and completion["model"] == "gemini-2.5-pro"
    message = completion["choices"][0]["message"]
    assert message["content"] == "Sure."
    call = message["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": '{"b":1,"a":2}'}
    assert call_signature(call["id"]) == SIGNATURE
    assert completion["usage"] == {
        "prompt_tokens": 1200,
        "completion_tokens": 50,
        "total_tokens": 1250,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 30},
    }


def test_a_blocked_prompt_is_a_content_filter_refusal_not_an_empty_success() -> None:
    answer = {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": 5},
    }
    choice = to_chat_completion(answer, "m")["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": "Gemini blocked the prompt (PROHIBITED_CONTENT)",
    }


def test_usage_of_nothing() -> None:
    assert openai_usage(None) is None
    assert openai_usage({})["total_tokens"] == 0  # type: ignore[index]


def test_error_details_and_durations() -> None:
    error = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "27s"},
            ],
        }
    }
    assert error_details(error) == ("27s", None)
    assert seconds("27s") == "27" and seconds("1.5s") == "1.5" and seconds("soon") is None


def _events(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events)


def _chunks(data: bytes) -> list[Any]:
    out = []
    for line in data.split(b"\n\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            out.append(orjson.loads(line[6:]))
    return out


def test_stream_is_translated_and_ends_at_the_finish() -> None:
    scanner = GeminiStreamScanner(strip_usage=False, shown_model=None)
    data = _events(
        {"responseId": "s1", "modelVersion": "g", "candidates": [{"content": {"parts": [{"text": "Hel"}]}}]},
        {
            "candidates": [
                {
                    "content": {"parts": [{"text": "lo"}, {"functionCall": {"name": "f", "args": {"x": 1}}}]},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2},
        },
    )
    # Cut mid-event and mid-CRLF: nothing is forwarded until an event is whole.
    out = scanner.feed(data[:30]) + scanner.feed(data[30:-1])
    assert not scanner.done
    out += scanner.feed(data[-1:])
    assert scanner.done and out.endswith(b"data: [DONE]\n\n")
    chunks = _chunks(out)
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hel"},
        {"content": "lo"},
    ]
    call = chunks[3]["choices"][0]["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert chunks[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["prompt_tokens"] == 4
    assert {c["id"] for c in chunks} == {"chatcmpl-s1"} and scanner.usage == chunks[5]["usage"]
    assert scanner.feed(_events({"candidates": []})) == b""


def test_stream_strips_usage_and_reports_errors_and_bad_json() -> None:
    quiet = GeminiStreamScanner(strip_usage=True, shown_model="shown")
    out = quiet.feed(
        _events({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "MAX_TOKENS"}]})
    )
    assert (
        all(c["choices"] for c in _chunks(out))
        and _chunks(out)[-1]["choices"][0]["finish_reason"] == "length"
    )
    assert _chunks(out)[0]["model"] == "shown" and quiet.usage is not None
    failing = GeminiStreamScanner(strip_usage=False, shown_model=None)
    failing.feed(_events({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}))
    assert failing.error is not None and failing.error["code"] == "UNAVAILABLE"
    broken = GeminiStreamScanner(strip_usage=False, shown_model=None)
    assert broken.feed(b"data: {not json\r\n\r\n") == b"" and broken.malformed is not None


def test_an_earlier_refusal_is_sent_as_what_the_model_said() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            {"role": "user", "content": "y"},
        ]
    }
    assert to_generate_request(body)["contents"][1] == {"role": "model", "parts": [{"text": "I can't."}]}


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_message_keys = st.sampled_from(["role", "content", "tool_calls", "tool_call_id", "name", "type", "function"])
_message = st.dictionaries(
    _message_keys,
    _json | st.sampled_from(["user", "assistant", "tool", "system", "text", "image_url"]),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "messages": st.lists(_message, max_size=4).map(
                lambda rest: [{"role": "user", "content": "q"}, *rest]
            )
        },
        optional={
            name: _json
            for name in (
                "tools",
                "tool_choice",
                "response_format",
                "stop",
                "max_tokens",
                "n",
                "stream",
                "logprobs",
                "temperature",
            )
        },
    )
)
@pytest.mark.slow
def test_any_request_translates_or_is_a_400(body: dict[str, Any]) -> None:
    try:
        out = to_generate_request(body)
    except InvalidRequestError:
        return
    orjson.dumps(out)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        _json
        | st.dictionaries(st.sampled_from(["candidates", "promptFeedback", "usageMetadata", "error"]), _json),
        max_size=4,
    )
)
def test_any_stream_event_is_translated_without_a_traceback(events: list[Any]) -> None:
    scanner = GeminiStreamScanner(strip_usage=False, shown_model=None)
    for event in events:
        scanner.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    to_chat_completion(events[0] if events and isinstance(events[0], dict) else {}, None)
