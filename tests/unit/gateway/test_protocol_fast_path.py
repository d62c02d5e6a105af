"""The fast paths of request validation decide exactly as the slow ones: a body the quick
chat (or Responses) check passes, pydantic accepts too; the level-by-level depth check agrees with the
plain stack walk."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gateway.api.protocol import ChatCompletionRequest, _body_depth_over, _depth_over, _plainly_valid_chat
from gateway.dialects.responses.wire import ResponsesRequest

# Values of every JSON type, valid and invalid for the modelled fields, with the edge cases
# of strict mode (bools for ints, ints for floats, empty strings, out-of-range numbers).
_SCALARS = st.sampled_from(
    [None, True, False, 0, 1, 2, 3, 128, 129, -1, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, float("nan"),
     float("inf"), "", "x", "user", "auto", "10", [], {}, ["x"], {"type": "text"}]
)  # fmt: skip
_CONTENT = st.one_of(
    _SCALARS,
    st.lists(st.one_of(_SCALARS, st.fixed_dictionaries({"type": _SCALARS})), max_size=2),
)
_MESSAGE = st.one_of(
    _SCALARS,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "tool", "robot", "", None, 1])},
        optional={"content": _CONTENT, "name": _SCALARS, "tool_call_id": _SCALARS, "extra": _SCALARS},
    ),
)
_FIELDS = (
    "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
    "tool_choice", "response_format", "user", "metadata", "unknown_field",
)  # fmt: skip
# Tools as agents send them, and each way one can be wrong (a missing or non-string type, a
# function that is no object, a name that is missing, empty or no string).
_FUNCTION = st.one_of(
    _SCALARS,
    st.fixed_dictionaries(
        {}, optional={"name": st.one_of(_SCALARS, st.just("read_file")), "parameters": _SCALARS}
    ),
)
_TOOL = st.one_of(
    _SCALARS,
    st.fixed_dictionaries(
        {}, optional={"type": st.one_of(_SCALARS, st.just("function")), "function": _FUNCTION}
    ),
)
_STREAM_OPTIONS = st.one_of(
    _SCALARS, st.fixed_dictionaries({}, optional={"include_usage": _SCALARS, "other": _SCALARS})
)
_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": _SCALARS,
        "messages": st.one_of(_SCALARS, st.lists(_MESSAGE, max_size=3)),
        "tools": st.one_of(_SCALARS, st.lists(_TOOL, max_size=3)),
        **{name: _SCALARS for name in _FIELDS},
        "stream_options": _STREAM_OPTIONS,
    },
)


def _accepted(schema: type[BaseModel], body: dict[str, Any]) -> None:
    try:
        schema.model_validate(body)
    except ValidationError as exc:  # pragma: no cover - the failure message
        raise AssertionError(f"fast path passed an invalid body: {exc}") from None


@settings(max_examples=1500, deadline=None)
@given(_BODY)
def test_what_the_quick_chat_check_passes_pydantic_accepts(body: dict[str, Any]) -> None:
    if _plainly_valid_chat(body):
        _accepted(ChatCompletionRequest, body)


def test_the_quick_chat_check_takes_the_common_request() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": "n"}],
        "stream": True,
        "max_tokens": 64,
        "temperature": 0.2,
        "user": "u-1",
        "metadata": {"k": "v"},
    }
    assert _plainly_valid_chat(body)
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
    assert _plainly_valid_chat({**body, "tools": [tool, {"type": "web_search"}]})  # an agent's
    # A deterministic request as clients write it (a JSON integer), a stream asking for usage.
    assert _plainly_valid_chat(
        {**body, "temperature": 0, "top_p": 1, "stream_options": {"include_usage": True}}
    )
    # Content as parts (an image, what the Anthropic Messages API's blocks become).
    parts = [{"type": "text", "text": "u"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    assert _plainly_valid_chat({**body, "messages": [{"role": "user", "content": parts}]})
    for bad_parts in ([{"text": "u"}], [{"type": 1}], ["u"], [[]]):
        assert not _plainly_valid_chat({**body, "messages": [{"role": "user", "content": bad_parts}]})
    for bad in (
        {"temperature": True},
        {"temperature": 3},
        {"top_p": 2},
        {"stream_options": {"include_usage": 1}},
    ):
        assert not _plainly_valid_chat({**body, **bad})  # pydantic decides (and refuses)


_RESPONSES_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": _SCALARS,
        "input": st.one_of(
            _SCALARS,
            st.lists(
                st.one_of(
                    _SCALARS,
                    st.fixed_dictionaries(
                        {}, optional={"type": _SCALARS, "role": _SCALARS, "content": _CONTENT}
                    ),
                ),
                max_size=3,
            ),
        ),
        "tools": st.one_of(_SCALARS, st.lists(_TOOL, max_size=2)),
        "text": st.one_of(_SCALARS, st.fixed_dictionaries({}, optional={"format": _SCALARS})),
        "metadata": st.one_of(_SCALARS, st.dictionaries(st.sampled_from(["a", "b"]), _SCALARS, max_size=2)),
        **{
            name: _SCALARS
            for name in (
                "instructions", "stream", "store", "previous_response_id", "max_output_tokens",
                "temperature", "top_p", "tool_choice", "reasoning", "parallel_tool_calls", "user",
            )
        },
    },
)  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(_RESPONSES_BODY)
def test_what_the_quick_responses_check_passes_pydantic_accepts(body: dict[str, Any]) -> None:
    if ResponsesRequest.plainly_valid(body):
        _accepted(ResponsesRequest, body)


def test_the_quick_responses_check_takes_an_agents_request() -> None:
    body = {
        "model": "m",
        "instructions": "You are an agent.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "find order 7"}]},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
        ],
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": "low"},
        "metadata": {"team": "support"},
        "temperature": 0,
        "max_output_tokens": 256,
        "store": False,
        "stream": True,
    }
    assert ResponsesRequest.plainly_valid(body)
    assert ResponsesRequest.plainly_valid({"model": "m", "input": "Hi"})
    for bad in (
        {"model": ""},
        {"input": [["x"]]},
        {"input": [{"role": 1}]},
        {"max_output_tokens": 0},
        {"max_output_tokens": 1.0},
        {"temperature": True},
        {"top_p": 1.5},
        {"metadata": {"n": 1}},
        {"text": {"format": "json"}},
        {"tools": [{"name": "lookup"}]},
        {"tools": {}},
        {"input": {}},
        {"reasoning": "low"},
        {"store": "no"},
    ):
        assert not ResponsesRequest.plainly_valid({**body, **bad})  # pydantic decides (and refuses)


def _reference_depth_over(body: Any, max_depth: int) -> bool:
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


_JSON = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(_JSON, st.integers(min_value=0, max_value=8))
def test_depth_check_agrees_with_the_stack_walk(body: Any, max_depth: int) -> None:
    assert _depth_over(body, max_depth) == _reference_depth_over(body, max_depth)


@settings(max_examples=500, deadline=None)
@given(st.lists(_JSON, max_size=3), _JSON, st.integers(min_value=0, max_value=8))
def test_a_bodys_depth_with_tools_agrees_with_the_stack_walk(
    tools: list[Any], rest: Any, max_depth: int
) -> None:
    body = {"model": "m", "rest": rest, "tools": tools}
    expected = _reference_depth_over(body, max_depth)
    over, tools_json = _body_depth_over(body, max_depth)
    assert over == expected
    assert _body_depth_over(body, max_depth) == (over, tools_json)  # the same tools again: remembered
    if tools_json is not None:  # handed on to shaping and routing: the tools' compact JSON
        assert tools_json == orjson.dumps(tools)


def test_tools_nested_too_deep_are_refused_every_time() -> None:
    deep: Any = "x"
    for _ in range(300):  # deeper than orjson writes, too
        deep = {"d": deep}
    for tools in ([{"type": "function", "function": {"name": "f", "parameters": deep}}], [deep]):
        for _ in range(2):
            assert _body_depth_over({"model": "m", "tools": tools}, 64)[0]
