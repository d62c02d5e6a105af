"""Chat completions <-> Converse: the request (cache points, tools, refusals) and the answer
(usage, stop reasons, the stream scanner)."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dialects.bedrock.request import CACHE_POINT, cache_sections, to_converse_request
from gateway.dialects.bedrock.response import ConverseStreamScanner, to_chat_completion
from gateway.errors import InvalidRequestError
from tests.fixtures.fake_bedrock import event, exception

LONG = "Harbor rules: berth by draught, tugs for ships over 200 m. " * 100


def converse(body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    options = {"model_id": "anthropic.claude", "structured_outputs": True, "cache_points": True}
    return to_converse_request(body, **{**options, "min_cache_tokens": 1024, **kwargs})


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def points(request: dict[str, Any]) -> int:
    blocks = [*request.get("system", ()), *(request.get("toolConfig") or {}).get("tools", ())]
    blocks += [b for m in request["messages"] for b in m["content"]]
    return sum(1 for b in blocks if b == CACHE_POINT)


def test_stable_system_prompt_gets_a_cache_point_and_a_short_one_none() -> None:
    long = converse(
        chat({"role": "system", "content": LONG}, {"role": "user", "content": "hi"}), stable_chars=len(LONG)
    )
    assert long["system"] == [{"text": LONG}, CACHE_POINT]
    short = converse(
        chat({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}), stable_chars=9
    )
    assert short["system"] == [{"text": "Be brief."}]
    off = converse(
        chat({"role": "system", "content": LONG}, {"role": "user", "content": "hi"}),
        stable_chars=len(LONG),
        cache_points=False,
    )
    assert points(off) == 0


def test_conversation_marks_the_previous_turn_and_the_last_message() -> None:
    request = converse(
        chat(
            {"role": "system", "content": LONG},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "second"},
        ),
        stable_chars=len(LONG),
    )
    assert request["messages"][1]["content"] == [{"text": "answer"}, CACHE_POINT]
    assert request["messages"][2]["content"] == [{"text": "second"}, CACHE_POINT]
    assert points(request) == 3


def test_client_marks_are_kept_but_never_more_than_four_points() -> None:
    marked = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(6)]
    request = converse(chat({"role": "user", "content": marked}))
    assert points(request) == 4
    assert request["messages"][0]["content"][:2] == [{"text": "part 0"}, CACHE_POINT]


def test_tools_tool_choice_and_tool_results_in_order() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    request = converse(
        chat(
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "calling",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": '{"x": 2}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "two"}]},
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "f"}},
        ),
    )
    assert request["toolConfig"] == {
        "tools": [
            {"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}, "description": "d"}}
        ],
        "toolChoice": {"tool": {"name": "f"}},
    }
    assistant, results = request["messages"][1], request["messages"][2]
    assert assistant["content"] == [
        {"text": "calling"},
        {"toolUse": {"toolUseId": "a", "name": "f", "input": {"x": 1}}},
        {"toolUse": {"toolUseId": "b", "name": "f", "input": {"x": 2}}},
    ]
    assert [b["toolResult"]["toolUseId"] for b in results["content"]] == ["a", "b"]
    assert results["content"][1]["toolResult"]["content"] == [{"text": "two"}]


def test_tool_choice_none_drops_the_tools_or_is_refused_with_tool_history() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert "toolConfig" not in converse(
        chat({"role": "user", "content": "x"}, tools=tools, tool_choice="none")
    )
    history = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "r"},
    ]
    with pytest.raises(InvalidRequestError) as refused:
        converse(chat(*history, tools=tools, tool_choice="none"))
    assert refused.value.code == "unsupported_parameter" and refused.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_unsupported_parameters_are_refused_naming_bedrock(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        converse(chat({"role": "user", "content": "x"}, **extra))
    assert refused.value.code == "unsupported_parameter" and refused.value.param == param
    assert "Bedrock deployments" in refused.value.message


def test_images_as_bytes_and_urls_refused() -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}
    request = converse(chat({"role": "user", "content": [part]}))
    assert request["messages"][0]["content"] == [{"image": {"format": "jpeg", "source": {"bytes": "AAAA"}}}]
    with pytest.raises(InvalidRequestError, match="data: URLs"):
        converse(
            chat(
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
            )
        )


def test_top_k_only_for_anthropic_models() -> None:
    body = chat({"role": "user", "content": "x"}, top_k=5)
    assert converse(body)["additionalModelRequestFields"] == {"top_k": 5}
    with pytest.raises(InvalidRequestError, match="top_k"):
        converse(body, model_id="meta.llama3-70b-instruct-v1:0")


def test_structured_output_is_refused_where_the_deployment_has_none() -> None:
    body = chat(
        {"role": "user", "content": "x"},
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
    )
    assert converse(body)["outputConfig"]["textFormat"]["structure"]["jsonSchema"] == {
        "schema": '{"type":"object"}',
        "name": "s",
    }
    with pytest.raises(InvalidRequestError, match="structured_outputs"):
        converse(body, structured_outputs=False)


def test_answer_usage_counts_cached_parts_inside_prompt_tokens() -> None:
    completion = to_chat_completion(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
            "stopReason": "guardrail_intervened",
            "usage": {
                "inputTokens": 10,
                "outputTokens": 3,
                "cacheReadInputTokens": 1000,
                "cacheWriteInputTokens": 200,
            },
        },
        "m",
    )
    assert completion["usage"] == {
        "prompt_tokens": 1210,
        "completion_tokens": 3,
        "total_tokens": 1213,
        "prompt_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 200},
    }
    assert completion["choices"][0]["finish_reason"] == "content_filter"


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("content_filtered", "content_filter"),
    ],
)
def test_stop_reasons(reason: str, finish: str) -> None:
    answer = {"output": {"message": {"content": []}}, "stopReason": reason}
    assert to_chat_completion(answer, "m")["choices"][0]["finish_reason"] == finish


def _data(out: bytes) -> list[Any]:
    return [
        orjson.loads(line[6:]) if line != b"data: [DONE]" else "[DONE]" for line in out.split(b"\n\n") if line
    ]


def test_scanner_translates_a_tool_stream_and_ends_at_metadata() -> None:
    scanner = ConverseStreamScanner(strip_usage=True, model="m")
    frames = [
        event("messageStart", {"role": "assistant"}),
        event(
            "contentBlockStart",
            {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t", "name": "f"}}},
        ),
        event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a": 1.50'}}}),
        event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": "}"}}}),
        event("messageStop", {"stopReason": "tool_use"}),
        event("metadata", {"usage": {"inputTokens": 5, "outputTokens": 2}}),
    ]
    out = _data(b"".join(scanner.feed(f) for f in frames))
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in out[1:4]]
    assert calls[0]["id"] == "t" and calls[0]["function"]["name"] == "f"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"a": 1.50}'
    assert out[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1] == "[DONE]" and scanner.done
    assert scanner.usage is not None and scanner.usage["prompt_tokens"] == 5


def test_scanner_exception_frame_is_an_error_event() -> None:
    scanner = ConverseStreamScanner(strip_usage=False, model="m")
    out = _data(scanner.feed(exception("throttlingException", "slow down")))
    assert scanner.error is not None and scanner.error["code"] == "ThrottlingException"
    assert out == [{"error": scanner.error}]
    assert scanner.error["message"] == "ThrottlingException: slow down" and not scanner.done


def test_scanner_corrupt_frame_is_malformed_never_done() -> None:
    scanner = ConverseStreamScanner(strip_usage=False, model="m")
    scanner.feed(event("messageStart", {"role": "assistant"}))
    assert scanner.feed(event("metadata", {"usage": {}}, corrupt=True)) == b""
    assert scanner.malformed is not None and b"CRC" in scanner.malformed
    assert not scanner.done


def test_nova_takes_no_cache_point_on_its_tools() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "description": LONG, "parameters": {"type": "object"}}}
    ]
    body = chat({"role": "user", "content": "x"}, tools=tools)
    claude_id, nova_id = "us.anthropic.claude-sonnet-4-20250514-v1:0", "amazon.nova-pro-v1:0"
    claude = converse(body, model_id=claude_id, sections=cache_sections(claude_id, cache_breakpoints=None))
    assert claude["toolConfig"]["tools"][-1] == CACHE_POINT
    nova = converse(body, model_id=nova_id, sections=cache_sections(nova_id, cache_breakpoints=None))
    assert CACHE_POINT not in nova["toolConfig"]["tools"]


@pytest.mark.parametrize(
    ("model_id", "setting", "expected"),
    [
        ("meta.llama3-1-70b-instruct-v1:0", None, 0),
        ("mistral.mistral-large-2407-v1:0", True, 1),
        ("arn:aws:bedrock:us-east-1:1:application-inference-profile/abc", None, 0),
        ("arn:aws:bedrock:us-east-1:1:application-inference-profile/abc", True, 1),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", False, 1),
    ],
)
def test_client_marks_reach_only_models_that_cache(
    model_id: str, setting: bool | None, expected: int
) -> None:
    marked = [{"type": "text", "text": "doc", "cache_control": {"type": "ephemeral"}}]
    sections = cache_sections(model_id, cache_breakpoints=setting)
    request = converse(
        chat({"role": "user", "content": marked}), model_id=model_id, cache_points=False, sections=sections
    )
    assert points(request) == expected


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Shapes the edge lets through (gateway/api/protocol.py): roles, content as a string or
# typed parts, typed tools and options; everything inside them is arbitrary.
_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "tool_use", "tool_result", "input_audio"])},
    optional={"text": _json, "image_url": _json, "cache_control": _json, "input": _json, "content": _json},
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])},
    optional={
        "content": st.none() | st.text(max_size=5) | st.lists(_part, max_size=3),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": _json, "function": st.dictionaries(st.sampled_from(["name", "arguments"]), _json)}
            ),
            max_size=2,
        ),
        "tool_call_id": st.text(max_size=3),
    },
)
_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search"])},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=3)}, optional={"parameters": _json}
        )
    },
)


@settings(max_examples=150, deadline=None)
@given(
    st.fixed_dictionaries(
        {"model": st.just("m"), "messages": st.lists(_message, min_size=1, max_size=5)},
        optional={
            "tools": st.lists(_tool, max_size=2),
            "tool_choice": st.sampled_from(["auto", "none", "required", "x"])
            | st.dictionaries(st.text(max_size=8), _json),
            "stop": _json,
            "response_format": st.dictionaries(st.sampled_from(["type", "json_schema"]), _json),
            "max_tokens": st.integers(1, 10**6),
            "temperature": st.floats(0, 2),
            "top_k": _json,
        },
    )
)
@pytest.mark.slow
def test_any_body_is_translated_or_refused_never_a_traceback(body: dict[str, Any]) -> None:
    with contextlib.suppress(InvalidRequestError):
        orjson.dumps(converse(body, stable_chars=3))


_event_names = st.sampled_from(
    [
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
        "x",
    ]
)
_event_body = st.dictionaries(
    st.sampled_from(
        ["contentBlockIndex", "start", "delta", "stopReason", "usage", "toolUse", "text", "input"]
    ),
    _json,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_event_names, _event_body), max_size=6), _event_body)
def test_any_converse_answer_or_event_is_read_never_a_traceback(
    events: list[tuple[str, dict[str, Any]]], answer: dict[str, Any]
) -> None:
    scanner = ConverseStreamScanner(strip_usage=False, model="m")
    for name, body in events:
        scanner.feed(event(name, body))
    to_chat_completion({"output": {"message": answer}, **answer}, "m")
