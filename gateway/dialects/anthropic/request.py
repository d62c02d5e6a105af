"""OpenAI chat completions -> Anthropic Messages: the request.

What is translated: leading ``system``/``developer`` messages -> ``system`` blocks (a later
one becomes a text block of the next user turn, where shaping put it on purpose), user and
assistant text, images (``data:`` URLs as base64 sources, others as URL sources), tool
calls -> ``tool_use`` blocks, ``tool`` messages -> ``tool_result`` blocks, ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``stop``, ``max_tokens``/``max_completion_tokens``,
``temperature``, ``top_p``, ``user``, ``response_format`` json_schema (structured output).
``cache_control`` marks a client put on parts or tools are kept.

What is refused (400): ``n`` > 1, ``logprobs``/``top_logprobs``, audio output,
``response_format`` ``json_object`` (or ``json_schema`` where the deployment has no
structured output), ``temperature`` above 1 (Anthropic's range is 0-1, OpenAI's 0-2), and
``temperature`` with ``top_p`` for a model that takes only one of them (Claude Opus 4.1
and later). Sampling knobs Anthropic has no equivalent for (``frequency_penalty``,
``presence_penalty``, ``seed``, ``logit_bias``) are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequestError

DROPPED = ("frequency_penalty", "presence_penalty", "seed", "logit_bias", "service_tier", "store")
"""Chat-completions fields with no Messages equivalent, dropped without error."""

_HEAD_ROLES = ("system", "developer")


def unsupported(param: str, why: str) -> InvalidRequestError:
    """The 400 for a chat-completions parameter an Anthropic deployment cannot honour."""
    return InvalidRequestError(
        f"'{param}' is not supported by Anthropic deployments: {why}",
        param=param,
        code="unsupported_parameter",
    )


def _text_block(text: str, part: Mapping[str, Any] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if part is not None and "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def _image_block(part: Mapping[str, Any]) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise InvalidRequestError("An image_url part needs image_url.url.", param="messages")
    source: dict[str, Any]
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header[5:].split(";")[0] or "image/png"
        source = {"type": "base64", "media_type": media_type, "data": data}
    else:
        source = {"type": "url", "url": url}
    block: dict[str, Any] = {"type": "image", "source": source}
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def content_blocks(content: Any) -> list[dict[str, Any]]:
    """A chat message's ``content`` (string or parts) as Messages content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_text_block(content)] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError("A message's content must be a string or an array.", param="messages")
    blocks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append(_text_block(part["text"], part))
        elif kind == "image_url":
            blocks.append(_image_block(part))
        elif isinstance(part, dict) and kind in ("image", "document", "tool_use", "tool_result"):
            blocks.append(dict(part))  # already an Anthropic block (a translated /v1/messages request)
        else:
            raise unsupported("messages", f"content part type {kind!r} has no Messages equivalent")
    return blocks


def _tool_use_blocks(calls: Any) -> list[dict[str, Any]]:
    blocks = []
    for call in calls or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments") or "{}"
        try:
            parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        except orjson.JSONDecodeError:
            raise InvalidRequestError(
                f"tool call {call.get('id')!r} has arguments that are not JSON", param="messages"
            ) from None
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call.get("id") or "",
            "name": function.get("name") or "",
            "input": parsed if isinstance(parsed, dict) else {},
        }
        if "cache_control" in call:
            block["cache_control"] = call["cache_control"]
        blocks.append(block)
    return blocks


def _tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id") or ""}
    if isinstance(content, str):
        block["content"] = content
    elif content is not None:
        block["content"] = [b for b in content_blocks(content) if b["type"] in ("text", "image")]
    if message.get("is_error"):
        block["is_error"] = True
    return block


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add a turn; consecutive turns of one role are merged (the API alternates roles)."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def split_messages(chat_messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(system blocks, messages)`` of a chat ``messages`` list."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    leading = True
    for message in chat_messages:
        if not isinstance(message, dict):
            raise InvalidRequestError("Each message must be an object.", param="messages")
        role = message.get("role")
        if role in _HEAD_ROLES:
            blocks = content_blocks(message.get("content"))
            if leading:
                system.extend(blocks)
            else:
                _append(out, "user", blocks)
            continue
        leading = False
        if role == "user":
            _append(out, "user", content_blocks(message.get("content")))
        elif role == "assistant":
            blocks = content_blocks(message.get("content"))
            blocks.extend(_tool_use_blocks(message.get("tool_calls")))
            _append(out, "assistant", blocks)
        elif role == "tool":
            _append(out, "user", [_tool_result(message)])
        else:
            raise InvalidRequestError(f"Unknown message role {role!r}.", param="messages")
    return system, out


def late_system_blocks(chat_messages: Any) -> int:
    """How many trailing blocks of the last Messages turn come from system or developer
    messages after the newest turn (where shaping puts what changes by the next request)."""
    count = 0
    if not isinstance(chat_messages, list):
        return 0
    for message in reversed(chat_messages):
        if not isinstance(message, dict) or message.get("role") not in _HEAD_ROLES:
            return count
        count += len(content_blocks(message.get("content")))
    return 0  # only system messages: nothing after a turn


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise unsupported("tools", "only function tools are translated")
        converted: dict[str, Any] = {
            "name": function.get("name"),
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            converted["description"] = function["description"]
        if "cache_control" in tool:
            converted["cache_control"] = tool["cache_control"]
        out.append(converted)
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any]
    if choice is None or choice == "auto":
        out = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise InvalidRequestError(
            "tool_choice must be none, auto, required or a function.", param="tool_choice"
        )
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    elif choice is None:
        return None
    return out


_BOTH_SAMPLERS = (
    "claude-2",
    "claude-instant",
    "claude-3",
    "claude-opus-4-0",
    "claude-sonnet-4-0",
    "claude-opus-4-2025",
    "claude-sonnet-4-2025",
)
"""Model-name prefixes of the Claude models that take ``temperature`` and ``top_p`` in one
request. Claude Opus 4.1 and every model since answer such a request with a 400."""


def takes_temperature_with_top_p(model: str) -> bool:
    """Whether the Anthropic ``model`` accepts ``temperature`` and ``top_p`` together (the
    default of a deployment's ``temperature_with_top_p``); an unknown name is taken to be a
    recent model, which does not."""
    return model in ("claude-opus-4", "claude-sonnet-4") or model.startswith(_BOTH_SAMPLERS)


def _sampling_refusals(body: Mapping[str, Any], model: str, temperature_with_top_p: bool) -> None:
    """OpenAI's sampling values that Anthropic's API would answer with a 400, refused here with
    the reason (the client can fix them; the gateway cannot guess which one was meant)."""
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and temperature > 1:
        raise InvalidRequestError(
            f"temperature {temperature} is above 1, the top of Anthropic's range (0 to 1; OpenAI's "
            "is 0 to 2): send a value from 0 to 1 for Anthropic deployments.",
            param="temperature",
            code="unsupported_parameter",
        )
    if temperature is not None and body.get("top_p") is not None and not temperature_with_top_p:
        raise InvalidRequestError(
            f"'temperature' and 'top_p' cannot both be sent to the Anthropic model {model!r}: send one "
            "of them (a deployment whose model accepts both sets temperature_with_top_p: true).",
            param="top_p",
            code="unsupported_parameter",
        )


def _refusals(body: Mapping[str, Any], structured_outputs: bool) -> dict[str, Any] | None:
    """Raise for what cannot be translated; return the structured-output format, if any."""
    n = body.get("n")
    if n is not None and n != 1:
        raise unsupported("n", "a Messages request has exactly one answer")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise unsupported("logprobs", "the Messages API returns no log probabilities")
    if body.get("audio") is not None or "audio" in (body.get("modalities") or ()):
        raise unsupported("audio", "no audio output")
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in (None, "text"):
        return None
    if kind == "json_schema" and structured_outputs:
        schema = fmt.get("json_schema") if isinstance(fmt, dict) else None
        if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
            return {"type": "json_schema", "schema": schema["schema"]}
        raise InvalidRequestError(
            "response_format json_schema needs json_schema.schema.", param="response_format"
        )
    why = (
        "use a json_schema with a schema instead"
        if kind == "json_object"
        else "this deployment has no structured output (structured_outputs: false)"
    )
    raise unsupported("response_format", f"type {kind!r}: {why}")


def to_messages_request(
    body: Mapping[str, Any],
    *,
    model: str,
    default_max_tokens: int,
    structured_outputs: bool,
    temperature_with_top_p: bool | None = None,
) -> dict[str, Any]:
    """A chat-completions ``body`` as a Messages API request body (``body`` is not changed).
    ``temperature_with_top_p``: whether ``model`` takes both (None: by its name)."""
    output_format = _refusals(body, structured_outputs)
    if temperature_with_top_p is None:
        temperature_with_top_p = takes_temperature_with_top_p(model)
    _sampling_refusals(body, model, temperature_with_top_p)
    chat_messages = body.get("messages")
    if not isinstance(chat_messages, list):
        raise InvalidRequestError("'messages' must be an array.", param="messages")
    system, messages = split_messages(chat_messages)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages}
    if system:
        out["system"] = system
    tools = body.get("tools")
    if tools:
        out["tools"] = _tools(tools)
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if isinstance(body.get("user"), str):
        out["metadata"] = {"user_id": body["user"]}
    if output_format is not None:
        out["output_config"] = {"format": output_format}
    if body.get("stream") is True:
        out["stream"] = True
    return out
