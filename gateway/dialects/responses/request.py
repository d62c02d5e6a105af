"""A Responses API request as a Chat Completions request, for upstreams that serve only chat.

What maps: ``instructions`` and input items (messages, ``function_call``,
``function_call_output``) to messages; function tools and ``tool_choice``; ``text.format``
to ``response_format``; ``max_output_tokens``; ``reasoning.effort`` to ``reasoning_effort``;
sampling parameters. What cannot (hosted tools such as ``web_search``, item types chat has
no equivalent for, background runs, server-side prompts or conversations) is a 400 naming
the field: never a silent drop.
"""

from __future__ import annotations

from typing import Any

from gateway.dialects.responses.wire import new_id
from gateway.errors import InvalidRequestError

# Responses fields the translation consumes or that only mean something to the gateway;
# any other field passes through to the chat upstream untouched.
_CONSUMED = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "max_output_tokens",
        "reasoning",
        "store",
        "previous_response_id",
        "include",
        "truncation",
        "metadata",
        "stream_options",
        "top_logprobs",
        "background",
        "conversation",
        "prompt",
        "max_tool_calls",
        "context_management",
    }
)
_PASSED = ("temperature", "top_p", "user", "parallel_tool_calls", "safety_identifier", "service_tier")


def to_chat(body: dict[str, Any], history: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    """The chat body for ``body`` (a Responses request), with ``history`` (the stored items of
    its ``previous_response_id`` chain) before its input. Raises 400 naming what cannot be
    translated for ``deployment``."""
    _refuse_unsupported(body)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    for item in history:
        _add_item(messages, item, "previous_response_id")
    for index, item in enumerate(input_items(body)):
        _add_item(messages, item, f"input[{index}]")
    out: dict[str, Any] = {k: v for k, v in body.items() if k not in _CONSUMED}
    out["messages"] = messages
    for name in _PASSED:
        if name in body:
            out[name] = body[name]
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(tool, i, deployment) for i, tool in enumerate(tools)]
    if "tool_choice" in body:
        out["tool_choice"] = _tool_choice(body["tool_choice"], deployment)
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict):
        response_format = _response_format(fmt)
        if response_format is not None:
            out["response_format"] = response_format
    verbosity = (body.get("text") or {}).get("verbosity")
    if verbosity is not None:
        out["verbosity"] = verbosity
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        out["reasoning_effort"] = effort
    if isinstance(body.get("top_logprobs"), int):
        out["logprobs"] = True
        out["top_logprobs"] = body["top_logprobs"]
    if body.get("stream") is True:
        out["stream_options"] = {"include_usage": True}
    return out


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a string is one user message)."""
    raw = body.get("input")
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list):
        return []
    return [item for item in raw if isinstance(item, dict)]


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("background") is True:
        raise _cannot("background", "background responses are not supported by this gateway")
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise _cannot(name, f"'{name}' (stored on OpenAI's side) cannot be served by a chat upstream")


def _cannot(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Unsupported parameter '{param}': {why}.", param=param, code="unsupported_parameter"
    )


def _text_of(content: Any, param: str) -> str | list[dict[str, Any]]:
    """Responses content parts as chat content (a string when all parts are text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind in ("input_image", "input_file") and part.get("file_id") is not None:
            raise _cannot(
                f"{param}.content[{i}]",
                f"an {kind} by file_id names a file kept by OpenAI, which a chat upstream cannot "
                "read: send its content (" + ("image_url" if kind == "input_image" else "file_data") + ")",
            )
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file" and isinstance(part.get("file_data"), str):
            file = {"file_data": part["file_data"], "filename": part.get("filename") or "file"}
            parts.append({"type": "file", "file": file})
        else:
            raise _cannot(
                f"{param}.content[{i}]",
                f"content part type {kind!r} has no chat completions equivalent",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise _cannot(f"{param}.role", f"role {role!r} is not a message role")
        messages.append({"role": role, "content": _text_of(item.get("content"), param)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        last = messages[-1] if messages else None
        # Parallel calls are consecutive items; chat wants them on one assistant message.
        if last is not None and last["role"] == "assistant" and not _has_text_after_calls(last):
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _text_of(output, param)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
    elif kind == "reasoning":
        # The model's own earlier reasoning: a chat upstream takes no such input.
        return
    else:
        raise _cannot(f"{param}.type", f"input item type {kind!r} has no chat completions equivalent")


def _has_text_after_calls(message: dict[str, Any]) -> bool:
    return "tool_calls" not in message and message.get("content") not in (None, "")


def _tool(tool: dict[str, Any], index: int, deployment: str) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise InvalidRequestError(
            f"The tool type {kind!r} in 'tools[{index}]' is a hosted tool that deployment "
            f"'{deployment}' does not offer (it is served through chat completions, which only "
            "knows function tools).",
            param=f"tools[{index}]",
            code="unsupported_tool",
        )
    function: dict[str, Any] = {"name": tool.get("name")}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, deployment: str) -> Any:
    if isinstance(choice, str) or choice is None:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else None
    raise InvalidRequestError(
        f"The tool_choice {kind!r} cannot be served by deployment '{deployment}' (chat completions).",
        param="tool_choice",
        code="unsupported_tool",
    )


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    if kind in (None, "text"):
        return None
    raise _cannot("text.format.type", f"format {kind!r} has no chat completions equivalent")


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored and listed by ``input_items``: each with an ``id``."""
    out = []
    for item in items:
        if "id" in item:
            out.append(item)
            continue
        kind = str(item.get("type") or "message")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
        stored = {"id": new_id(prefix), **item, "type": kind}
        if kind == "message":
            stored.setdefault("status", "completed")
            if isinstance(stored.get("content"), str):
                part = "output_text" if stored.get("role") == "assistant" else "input_text"
                stored["content"] = [{"type": part, "text": stored["content"]}]
        out.append(stored)
    return out
