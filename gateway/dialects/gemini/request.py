"""OpenAI chat completions -> a Gemini ``generateContent`` request.

What is translated: leading ``system``/``developer`` messages -> ``systemInstruction`` (a
later one becomes a text part of the next user turn, where shaping put it on purpose);
user and assistant turns -> ``contents`` with roles ``user``/``model`` (consecutive turns of
one role merged); text parts; images (``data:`` URLs as ``inlineData``, other URLs as
``fileData``) and ``input_audio``; assistant ``tool_calls`` -> ``functionCall`` parts and
``tool`` messages -> ``functionResponse`` parts, in order, the arguments as the JSON object
the client sent (keys in its order); ``tools`` -> ``functionDeclarations`` with
``parametersJsonSchema`` (:mod:`~gateway.dialects.gemini.schema`); ``tool_choice`` ->
``toolConfig.functionCallingConfig``; ``response_format`` -> ``responseMimeType``
(+ ``responseJsonSchema``); ``max_tokens``/``max_completion_tokens``, ``temperature``,
``top_p``, ``top_k``, ``stop``, ``seed``, ``n``, ``presence_penalty``,
``frequency_penalty`` -> ``generationConfig``.

Tool call ids: Gemini names no call ids, so the gateway makes them
(:func:`make_call_id`), and Gemini 3 models sign their function calls with a
``thoughtSignature`` they must get back on the next turn (else a 400). The signature is
carried inside the id the client echoes (``call_<16 hex>_<signature, URL-safe base64>``),
so multi-turn tool use works through any OpenAI, Responses or Messages client unchanged.

What is refused (400 ``unsupported_parameter``): ``logprobs``/``top_logprobs``,
``logit_bias``, audio output, ``prediction``, ``web_search_options``, non-function tools,
content parts Gemini has no equivalent for. Dropped without error: ``user``, ``metadata``,
``store``, ``service_tier``, ``parallel_tool_calls``, ``prompt_cache_key`` (Gemini caches
prefixes implicitly), ``reasoning_effort`` and ``cache_control`` marks.
"""

from __future__ import annotations

import mimetypes
import re
import secrets
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.dialects.gemini.schema import gemini_schema
from gateway.errors import InvalidRequestError

_HEAD_ROLES = ("system", "developer")
REFUSED = {
    "logprobs": "Gemini deployments return no log probabilities through the gateway",
    "top_logprobs": "Gemini deployments return no log probabilities through the gateway",
    "logit_bias": "Gemini has no logit bias",
    "prediction": "Gemini has no predicted outputs",
    "web_search_options": "use a Gemini grounding tool upstream instead",
}
"""Chat-completions fields a Gemini deployment cannot honour, and why (a 400 each)."""

_CALL_ID = re.compile(r"^call_[0-9a-f]{16}_([A-Za-z0-9_-]+)$")


def unsupported(param: str, why: str) -> InvalidRequestError:
    """The 400 for a chat-completions parameter a Gemini deployment cannot honour."""
    return InvalidRequestError(
        f"'{param}' is not supported by Gemini deployments: {why}", param=param, code="unsupported_parameter"
    )


def make_call_id(signature: Any = None) -> str:
    """A fresh tool call id, carrying a function call's ``thoughtSignature`` when it has one."""
    call_id = "call_" + secrets.token_hex(8)
    if isinstance(signature, str) and signature:
        call_id += "_" + signature.replace("+", "-").replace("/", "_").rstrip("=")
    return call_id


def call_signature(call_id: Any) -> str | None:
    """The ``thoughtSignature`` a tool call id made by :func:`make_call_id` carries, if any."""
    match = _CALL_ID.match(call_id) if isinstance(call_id, str) else None
    if match is None:
        return None
    raw = match.group(1).replace("-", "+").replace("_", "/")
    return raw + "=" * (-len(raw) % 4)


def _media_part(url: str, param: str) -> dict[str, Any]:
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header[5:].split(";")[0] or "application/octet-stream"
        return {"inlineData": {"mimeType": media_type, "data": data}}
    if not url.startswith(("https://", "http://", "gs://")):
        raise InvalidRequestError(
            f"{param}: a media URL must be a data:, https:// or gs:// URL.", param=param
        )
    guessed = mimetypes.guess_type(url.split("?")[0])[0]
    return {"fileData": {"mimeType": guessed or "image/jpeg", "fileUri": url}}


def _part(part: Any) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"text": part["refusal"]}  # an earlier assistant turn's refusal, as what it said
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRequestError("An image_url part needs image_url.url.", param="messages")
        return _media_part(url, "messages")
    if kind == "input_audio" and isinstance(part.get("input_audio"), dict):
        audio = part["input_audio"]
        return {
            "inlineData": {"mimeType": f"audio/{audio.get('format', 'wav')}", "data": audio.get("data", "")}
        }
    raise unsupported("messages", f"content part type {kind!r} has no Gemini equivalent")


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A chat message's ``content`` (string or parts) as Gemini parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError("A message's content must be a string or an array.", param="messages")
    return [_part(part) for part in content]


def _arguments(call: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidRequestError(
            f"tool call {call.get('id')!r} has arguments that are not a JSON object", param="messages"
        )
    return parsed


def _call_parts(calls: Any, names: dict[str, str]) -> list[dict[str, Any]]:
    parts = []
    for call in calls or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        name = str(function.get("name") or "")
        names[str(call.get("id") or "")] = name
        part: dict[str, Any] = {
            "functionCall": {"name": name, "args": _arguments(call, function.get("arguments"))}
        }
        signature = call_signature(call.get("id"))
        if signature is not None:
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts


def _response_part(message: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    call_id = str(message.get("tool_call_id") or "")
    name = message.get("name") or names.get(call_id)
    if not name:
        raise InvalidRequestError(
            f"tool message for call {call_id!r} follows no assistant tool call with that id", param="messages"
        )
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = "".join(texts)
    # Gemini documents "output" for a function's result and "error" for its failure.
    key = "error" if message.get("is_error") else "output"
    return {"functionResponse": {"name": name, "response": {key: content if content is not None else ""}}}


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    """Add a turn; consecutive turns of one role are merged (Gemini alternates roles, and a
    model turn's function responses belong in one user turn)."""
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def split_messages(chat_messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(systemInstruction parts, contents)`` of a chat ``messages`` list."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the responses
    leading = True
    for message in chat_messages:
        if not isinstance(message, dict):
            raise InvalidRequestError("Each message must be an object.", param="messages")
        role = message.get("role")
        if role in _HEAD_ROLES:
            parts = content_parts(message.get("content"))
            if leading:
                system.extend(parts)
            else:
                _append(contents, "user", parts)
            continue
        leading = False
        if role == "user":
            _append(contents, "user", content_parts(message.get("content")))
        elif role == "assistant":
            parts = content_parts(message.get("content"))
            parts.extend(_call_parts(message.get("tool_calls"), names))
            _append(contents, "model", parts)
        elif role == "tool":
            _append(contents, "user", [_response_part(message, names)])
        else:
            raise InvalidRequestError(f"Unknown message role {role!r}.", param="messages")
    return system, contents


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequestError("tools must be an array.", param="tools")
    declarations = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise unsupported("tools", "only function tools are translated")
        declaration: dict[str, Any] = {"name": function.get("name")}
        if function.get("description"):
            declaration["description"] = function["description"]
        parameters = function.get("parameters")
        if isinstance(parameters, dict) and parameters.get("properties"):
            declaration["parametersJsonSchema"] = gemini_schema(parameters)
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}]


def _tool_config(choice: Any) -> dict[str, Any] | None:
    config: dict[str, Any]
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        config = {"mode": {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        config = {"mode": "ANY", "allowedFunctionNames": [choice["function"].get("name")]}
    else:
        raise InvalidRequestError(
            "tool_choice must be none, auto, required or a function.", param="tool_choice"
        )
    return {"functionCallingConfig": config}


def _output_format(fmt: Any) -> dict[str, Any]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in (None, "text"):
        return {}
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        schema = fmt.get("json_schema")
        if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
            return {
                "responseMimeType": "application/json",
                "responseJsonSchema": gemini_schema(schema["schema"]),
            }
        raise InvalidRequestError(
            "response_format json_schema needs json_schema.schema.", param="response_format"
        )
    raise unsupported("response_format", f"type {kind!r}")


_GENERATION = (
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("top_k", "topK"),
    ("seed", "seed"),
    ("n", "candidateCount"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)


def generation_config(body: Mapping[str, Any]) -> dict[str, Any]:
    """``generationConfig`` from the chat request's sampling and output fields."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise unsupported(name, why)
    if body.get("audio") is not None or "audio" in (body.get("modalities") or ()):
        raise unsupported("audio", "no audio output through the gateway")
    n = body.get("n")
    if body.get("stream") is True and n is not None and n != 1:
        raise unsupported("n", "a streamed Gemini answer has one candidate")
    config: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        config["maxOutputTokens"] = max_tokens
    for name, field in _GENERATION:
        if body.get(name) is not None:
            config[field] = body[name]
    stop = body.get("stop")
    if isinstance(stop, str) and stop:
        config["stopSequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and stop:
        config["stopSequences"] = stop
    elif stop:
        raise InvalidRequestError("stop must be a string or an array of strings.", param="stop")
    config.update(_output_format(body.get("response_format")))
    return config


def to_generate_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions ``body`` as a ``generateContent`` request body (``body`` is not changed)."""
    config = generation_config(body)
    chat_messages = body.get("messages")
    if not isinstance(chat_messages, list):
        raise InvalidRequestError("'messages' must be an array.", param="messages")
    system, contents = split_messages(chat_messages)
    if not contents:
        raise InvalidRequestError("Gemini needs at least one user or assistant message.", param="messages")
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    tools = body.get("tools")
    if tools:
        out["tools"] = _tools(tools)
        tool_config = _tool_config(body.get("tool_choice"))
        if tool_config is not None:
            out["toolConfig"] = tool_config
    if config:
        out["generationConfig"] = config
    return out
