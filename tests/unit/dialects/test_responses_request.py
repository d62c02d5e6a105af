"""Responses requests as chat completions: what maps, and what is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.protocol import validate
from gateway.dialects.responses.request import input_items, to_chat, with_ids
from gateway.dialects.responses.wire import ResponsesRequest
from gateway.errors import InvalidRequestError


def chat(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return to_chat({"model": "m", **body}, history or [], "dep")


def test_instructions_and_string_input_become_system_and_user() -> None:
    out = chat({"instructions": "Be terse.", "input": "Hi"})
    assert out["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert out["model"] == "m" and "input" not in out and "instructions" not in out


def test_function_calls_and_outputs_both_ways() -> None:
    out = chat(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a":1}'},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": "rain"},
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": {"type": "function", "name": "w"},
        }
    )
    user, calls, first, second = out["messages"]
    assert user == {"role": "user", "content": "weather?"}
    assert [c["id"] for c in calls["tool_calls"]] == ["c1", "c2"]  # parallel calls on one message
    assert calls["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"a":1}'}
    assert first == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert second["tool_call_id"] == "c2"
    assert out["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "w"}}


def test_text_format_max_output_tokens_reasoning_and_stream() -> None:
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    out = chat(
        {
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "S", "schema": schema, "strict": True}},
            "max_output_tokens": 50,
            "reasoning": {"effort": "low"},
            "stream": True,
            "store": True,
            "metadata": {"k": "v"},
            "seed": 7,
        }
    )
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "S", "schema": schema, "strict": True},
    }
    assert list(out["response_format"]["json_schema"]["schema"]["properties"]) == ["b", "a"]  # order kept
    assert out["max_completion_tokens"] == 50 and out["reasoning_effort"] == "low"
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert "store" not in out and "metadata" not in out and out["seed"] == 7


def test_history_comes_before_the_input() -> None:
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "I am Ada"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada"}]},
        {"type": "reasoning", "summary": []},
    ]
    out = chat({"instructions": "New rules.", "input": "Name?"}, history)
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user"]
    assert out["messages"][2]["content"] == "Hi Ada"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}, "tools[1]"),
        ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0]"),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ],
)
def test_untranslatable_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        chat(body)
    assert info.value.param == param and info.value.status == 400


def test_input_items_get_ids_for_the_store() -> None:
    items = with_ids(
        [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c", "output": "1"}]
    )
    assert items[0]["id"].startswith("msg_") and items[0]["type"] == "message"
    assert items[0]["content"] == [{"type": "input_text", "text": "hi"}]
    assert items[1]["id"].startswith("fco_")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["type", "role", "content", "call_id", "name", "arguments", "output", "text", "image_url"]
)
_item = st.dictionaries(
    _keys, _json | st.sampled_from(["message", "function_call", "user", "input_text"]), max_size=5
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"model": st.just("m")},
        optional={
            "input": st.text(max_size=5) | st.lists(_item, max_size=4),
            "instructions": st.text(max_size=5),
            "tools": st.lists(
                st.dictionaries(st.sampled_from(["type", "name"]), _json, max_size=2), max_size=2
            ),
            "tool_choice": _json,
            "text": st.dictionaries(st.sampled_from(["format", "verbosity"]), _json, max_size=2),
            "reasoning": st.dictionaries(st.sampled_from(["effort"]), _json, max_size=1),
        },
    )
)
def test_any_valid_request_translates_or_is_a_400(body: dict[str, Any]) -> None:
    """Whatever passes the wire model either translates or is refused with a 400: never a traceback."""
    try:
        validate(ResponsesRequest, body)
    except InvalidRequestError:
        return
    try:
        out = to_chat(body, [], "dep")
    except InvalidRequestError as exc:
        assert exc.param
        return
    assert isinstance(out["messages"], list)
    with_ids(input_items(body))


# --- images and files: the part the client sent is the part the upstream gets ---------------

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PDF = "data:application/pdf;base64,JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PC9UeXBlL0NhdGFsb2c+PgplbmRvYmoK"


def _parts(*content: dict[str, Any]) -> Any:
    return chat({"input": [{"role": "user", "content": list(content)}]})["messages"][0]["content"]


@pytest.mark.parametrize(
    "url", ["https://example.com/harbor.jpg", "https://cdn.example.org/a/b/lighthouse.png?v=2", PNG]
)
def test_input_image_becomes_an_image_url_part_with_the_same_url(url: str) -> None:
    parts = _parts(
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": url, "detail": "high"},
    )
    assert parts == [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
    ]


def test_input_image_without_detail_and_two_images_keep_their_order() -> None:
    parts = _parts(
        {"type": "input_image", "image_url": "https://example.com/1.jpg"},
        {"type": "input_image", "image_url": PNG},
    )
    assert parts == [
        {"type": "image_url", "image_url": {"url": "https://example.com/1.jpg"}},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]


@pytest.mark.parametrize(("filename", "sent_as"), [("harbor-rules.pdf", "harbor-rules.pdf"), (None, "file")])
def test_input_file_data_and_filename_reach_the_chat_file_part(filename: str | None, sent_as: str) -> None:
    part: dict[str, Any] = {"type": "input_file", "file_data": PDF}
    if filename is not None:
        part["filename"] = filename
    parts = _parts({"type": "input_text", "text": "Summarise."}, part)
    assert parts[1] == {"type": "file", "file": {"file_data": PDF, "filename": sent_as}}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_image", "file_id": "file-abc123"},
        {"type": "input_file", "file_id": "file-abc123"},
        {"type": "input_file", "file_id": "file-abc123", "filename": "x.pdf"},
    ],
)
def test_a_part_by_file_id_is_refused_naming_it(part: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        _parts({"type": "input_text", "text": "x"}, part)
    assert info.value.param == "input[0].content[1]" and "file_id" in info.value.message


def test_images_reach_an_anthropic_deployment_as_image_blocks() -> None:
    from gateway.dialects.anthropic.request import to_messages_request

    body = chat(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Compare."},
                        {"type": "input_image", "image_url": "https://example.com/harbor.jpg"},
                        {"type": "input_image", "image_url": PNG},
                    ],
                }
            ]
        }
    )
    sent = to_messages_request(body, model="claude", default_max_tokens=64, structured_outputs=True)
    blocks = sent["messages"][0]["content"]
    assert blocks[1] == {"type": "image", "source": {"type": "url", "url": "https://example.com/harbor.jpg"}}
    data = PNG.partition(",")[2]
    assert blocks[2] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": data},
    }
