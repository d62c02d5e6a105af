"""How a chat body becomes prompt bytes: the contract the gateway's checkpoints and the
simulator's token and cache-block counts share."""

from __future__ import annotations

import orjson

from gateway.prompt_render import content_bytes, render_chat


def test_render_puts_tools_first_then_messages_in_order() -> None:
    tool = {"type": "function", "function": {"name": "b", "parameters": {"z": 1, "a": 2}}}
    body = {
        "tools": [tool],
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "U1"}, {"type": "text", "text": "U2"}]},
        ],
    }
    # Key order is kept as given: the tool is serialized exactly as the request carried it.
    assert render_chat(body) == orjson.dumps(tool) + b"<|system|>\nS\n<|user|>\nU1U2\n"


def test_render_non_text_parts_and_tool_calls_contribute_their_json() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    }
    expected = (
        b"<|user|>\nlook" + orjson.dumps(image) + b"\n"
        b"<|assistant|>\n" + orjson.dumps(calls) + b"\n"
        b"<|tool|>\n42\n"
    )
    assert render_chat(body) == expected
    assert content_bytes("é") == "é".encode()


def test_a_role_renders_as_its_text_whatever_it_is() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "función", "content": "b"},
            {"role": 7, "content": "c"},
            {"content": "d"},
        ]
    }
    assert render_chat(body) == "<|user|>\na\n<|función|>\nb\n<||>\nc\n<||>\nd\n".encode()
