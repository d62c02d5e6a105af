"""How a chat request body is flattened to prompt bytes, as a chat template would render it.

This is the contract prefix-cache accounting rests on: the gateway hashes these bytes
into checkpoints (:mod:`gateway.cachestats.chain`) and the simulator (the upstream of
the tests and benchmarks) counts tokens and cache blocks over the very same bytes, so
the gateway's expected hits and the simulator's reported ``cached_tokens`` agree.

Each tool is ``orjson.dumps`` of the request's tool object, in request order, with no
separator; then each message is ``<|role|>\\n{content}{tool_calls}\\n``, where content is
the string, or the text parts concatenated with every other part as its
``orjson.dumps``, and ``tool_calls`` (when present) is ``orjson.dumps`` of the
message's list. Keep it simple and keep it stable.

A module of its own at the package top, importing nothing of the gateway: the simulator
imports it, and must not pull in the gateway's settings, Redis client and policy with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson


def text_bytes(text: str) -> bytes:
    """``text`` as UTF-8 prompt bytes; lone surrogates (JSON may carry ``"\\ud800"``) pass
    through instead of crashing the tokenizer."""
    return text.encode("utf-8", "surrogatepass")


def content_bytes(content: object) -> bytes:
    """A message's ``content`` as prompt bytes: text parts concatenated, other parts as JSON."""
    if content is None:
        return b""
    if isinstance(content, str):
        return text_bytes(content)
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(text_bytes(part["text"]))
            else:
                out.append(orjson.dumps(part))
        return b"".join(out)
    return orjson.dumps(content)


def render_chat(body: Mapping[str, object], rendered_tools: bytes | None = None) -> bytes:
    """The prompt a chat template would render for a chat request body.

    Each tool as ``orjson.dumps(tool)`` in request order (no separator), then each
    message as ``<|role|>\\n{content}{tool_calls JSON}\\n``. Message fields other than
    ``role``, ``content`` and ``tool_calls`` are not part of the prompt. ``rendered_tools``:
    the tools' part, when the caller has it (shaping renders a tool set once).
    """
    if rendered_tools is not None:
        parts = [rendered_tools]
    else:
        tools = body.get("tools")
        parts = list(map(orjson.dumps, tools)) if isinstance(tools, list) else []
    messages = body.get("messages")
    if isinstance(messages, list):
        append = parts.append
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if not isinstance(role, str):
                role = ""
            opening = _OPENINGS.get(role)
            append(b"<|" + text_bytes(role) + b"|>\n" if opening is None else opening)
            content = message.get("content")
            if isinstance(content, str):  # text_bytes, without a call per message
                append(content.encode("utf-8", "surrogatepass"))
            else:
                append(content_bytes(content))
            tool_calls = message.get("tool_calls")
            if tool_calls:
                append(orjson.dumps(tool_calls))
            append(b"\n")
    return b"".join(parts)


_OPENINGS = {
    role: f"<|{role}|>\n".encode() for role in ("", "system", "developer", "user", "assistant", "tool")
}
"""A message's opening, per common role (built once, not per message)."""
