"""Anthropic Messages (what a client sent to ``/v1/messages``) -> chat completions, and
the chat-completions answer back as a Messages answer; errors in Anthropic's JSON.

The request is translated once, at the edge, so shaping, routing, dispatch and the books
treat it as any chat request. Blocks an OpenAI-compatible model cannot take (``document``,
search results) are kept as they are: an Anthropic deployment gets them back untouched,
another answers its own 400. ``cache_control`` marks ride along on parts and tools (the
anthropic provider turns them back into breakpoints; OpenAI-compatible servers ignore
them). ``thinking`` is not relayed: the answer comes without extended thinking.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequestError, SwitchyardError

FINISH_TO_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
"""OpenAI ``finish_reason`` -> Anthropic ``stop_reason``."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_object(exc: SwitchyardError) -> dict[str, Any]:
    """``exc`` as Anthropic's error object (``{"type": "error", "error": {"type", "message"}}``)."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A user or system block as a chat content part."""
    kind = block.get("type")
    part: dict[str, Any]
    if kind == "text":
        part = {"type": "text", "text": block.get("text", "")}
    elif kind == "image" and isinstance(block.get("source"), dict):
        source = block["source"]
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
        else:
            url = str(source.get("url", ""))
        part = {"type": "image_url", "image_url": {"url": url}}
    else:
        return dict(block)  # documents and the like: only an Anthropic deployment reads them
    if "cache_control" in block:
        part["cache_control"] = block["cache_control"]
    return part


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _bad(f"{where}: content must be a string or an array of blocks", where)
    return content


def _tool_result_text(content: Any) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    return [_part(b) for b in content if isinstance(b, dict)]


def _user_turn(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages first, then the rest as one message."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in _blocks(content, where):
        if block.get("type") == "tool_result":
            message: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id", ""),
                "content": _tool_result_text(block.get("content")),
            }
            if block.get("is_error"):
                message["is_error"] = True
            out.append(message)
        else:
            parts.append(_part(block))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(content, where):
        if block.get("type") == "text":
            texts.append(_part(block))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
        # thinking blocks are not relayed (see the module docstring)
    message: dict[str, Any] = {"role": "assistant", "content": texts or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """``(OpenAI tool_choice, parallel_tool_calls)``."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    serial = isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}, not serial
    if mapped is None:
        raise _bad("tool_choice.type must be auto, any, tool or none", "tool_choice")
    return mapped, not serial


def to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages request body as a chat-completions body (400 for a body that is not one)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required", "model")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens: a positive integer is required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: at least one message is required", "messages")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        chat.append({"role": "system", "content": system})
    elif isinstance(system, list) and system:
        chat.append({"role": "system", "content": [_part(b) for b in _blocks(system, "system")]})
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        where = f"messages.{i}"
        if role == "user":
            chat.extend(_user_turn(message.get("content"), where))
        elif role == "assistant":
            chat.append(_assistant_turn(message.get("content"), where))
        else:
            raise _bad(f"{where}.role: Input should be 'user' or 'assistant'", where)
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": chat}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = [_tool(t) for t in tools]
        if body.get("tool_choice") is not None:
            out["tool_choice"], parallel = _tool_choice(body["tool_choice"])
            if not parallel:
                out["parallel_tool_calls"] = False
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    output_config = body.get("output_config")
    fmt = output_config.get("format") if isinstance(output_config, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"]},
        }
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise _bad("tools: each tool needs a name", "tools")
    function: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object"},
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    out: dict[str, Any] = {"type": "function", "function": function}
    if "cache_control" in tool:
        out["cache_control"] = tool["cache_control"]
    return out


def anthropic_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """An OpenAI usage object (cached tokens inside ``prompt_tokens``) in Anthropic's shape."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    return {
        "input_tokens": max(0, prompt - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def to_message(completion: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A ``chat.completion`` as a Messages API answer."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    reply = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": arguments,
            }
        )
    stop_reason, stop_sequence = stop_of(choice)
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": completion.get("model") or model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(completion.get("usage")),
    }


def message_id(chat_id: Any) -> str:
    """A Messages id for a chat answer's id (an Anthropic upstream's ``msg_`` id kept as it is)."""
    return "msg_" + str(chat_id or "").removeprefix("msg_")


def stop_of(choice: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat choice. A stop string that ended the answer
    is in the choice's ``stop_reason`` (vLLM's field; the anthropic provider fills it from
    Anthropic's ``stop_sequence``): then the reason is ``stop_sequence``."""
    finish = choice.get("finish_reason")
    sequence = choice.get("stop_reason")
    if finish == "stop" and isinstance(sequence, str):
        return "stop_sequence", sequence
    return FINISH_TO_STOP.get(str(finish), "end_turn"), None


def estimate_tokens(body: Mapping[str, Any]) -> int:
    """``count_tokens``' answer: the gateway's estimate (4 bytes a token) of the prompt."""
    prompt = {k: body.get(k) for k in ("system", "messages", "tools") if body.get(k) is not None}
    return max(1, len(orjson.dumps(prompt)) // 4)
