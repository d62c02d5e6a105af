"""OpenAI chat completions -> a Bedrock Converse request.

The request goes through the Messages translation first
(:func:`gateway.dialects.anthropic.request.to_messages_request`): Converse has the same
structure (top-level system blocks, alternating user/assistant turns, tool results in user
turns), so its role merging, tool calls, tool results and refusals are reused, and the cache
breakpoints are placed on it by :mod:`gateway.shaping.breakpoints` exactly as for an Anthropic
deployment. Each ``cache_control`` mark then becomes a ``{"cachePoint": {"type": "default"}}``
block right after the block it marked, in ``system``, a message's ``content`` or
``toolConfig.tools`` (at most :data:`MAX_CACHE_POINTS`).

Mapped: ``max_tokens``/``max_completion_tokens`` -> ``inferenceConfig.maxTokens``,
``temperature``, ``top_p`` -> ``topP``, ``stop`` -> ``stopSequences``, tools ->
``toolConfig.tools[].toolSpec`` (``inputSchema.json``), ``tool_choice`` -> ``toolConfig.toolChoice``
(``auto``/``any``/``tool``), ``response_format`` json_schema -> ``outputConfig.textFormat``
(Converse's own structured output), images given as ``data:`` URLs. Refused (400
``unsupported_parameter``): what the Messages translation refuses, image URLs (Converse takes
bytes or S3 only), ``tool_choice: none`` once the conversation holds tool calls (Converse has
no such choice and needs the tools to read them), ``top_k`` outside Anthropic models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.dialects.anthropic.request import late_system_blocks, to_messages_request
from gateway.errors import InvalidRequestError
from gateway.shaping.breakpoints import MAX_BREAKPOINTS, place_breakpoints, split_stable_system

MAX_CACHE_POINTS = MAX_BREAKPOINTS
"""Bedrock's limit on ``cachePoint`` blocks per request (the same 4 as Anthropic's)."""

CACHE_POINT: dict[str, Any] = {"cachePoint": {"type": "default"}}

ALL_SECTIONS = ("tools", "system", "messages")
CACHE_POINT_SECTIONS = {"anthropic": ALL_SECTIONS, "nova": ("system", "messages")}
"""Model families with prompt caching on Bedrock, and where they take cache points (Nova's
tool definitions take none); other models refuse cache points."""


def cache_sections(model_id: str, *, cache_breakpoints: bool | None) -> tuple[str, ...]:
    """Where a request to ``model_id`` may carry cache points at all (the gateway's or the
    client's): its family's sections; for any other model none, unless the policy turns
    them on (``cache_breakpoints: true``, e.g. for an application inference profile ARN,
    which does not name its model)."""
    known = CACHE_POINT_SECTIONS.get(model_family(model_id))
    if known is not None:
        return known
    return ALL_SECTIONS if cache_breakpoints else ()


def model_family(model_id: str) -> str:
    """``anthropic``, ``nova``, ``meta``, ``mistral`` ... of a model id, an inference profile
    id (``us.anthropic.claude-...``) or its ARN; ``""`` when the id does not say."""
    for family, marker in (("anthropic", "anthropic."), ("nova", "amazon.nova"), ("meta", "meta.")):
        if marker in model_id:
            return family
    return "mistral" if "mistral." in model_id else ""


def unsupported(param: str, why: str) -> InvalidRequestError:
    """The 400 for a chat-completions parameter a Bedrock deployment cannot honour."""
    return InvalidRequestError(
        f"'{param}' is not supported by Bedrock deployments: {why}", param=param, code="unsupported_parameter"
    )


class _Points:
    """Counts the cache points of one request so the limit is never passed (the first ones,
    in prefix order, are kept: each later one only extends a prefix already marked)."""

    def __init__(self, left: int = MAX_CACHE_POINTS) -> None:
        self.left = left

    def after(self, block: Mapping[str, Any], converted: dict[str, Any]) -> list[dict[str, Any]]:
        if "cache_control" not in block or self.left <= 0:
            return [converted]
        self.left -= 1
        return [converted, dict(CACHE_POINT)]


def _image(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") != "base64":
        raise unsupported("messages", "images must be data: URLs (Converse takes image bytes, not URLs)")
    media_type = str(source.get("media_type") or "image/png")
    return {
        "image": {"format": media_type.partition("/")[2] or "png", "source": {"bytes": source.get("data")}}
    }


def _tool_result(block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"text": content})
    elif isinstance(content, list):
        parts.extend(
            _image(part) if part.get("type") == "image" else {"text": str(part.get("text", ""))}
            for part in content
        )
    result: dict[str, Any] = {"toolUseId": block.get("tool_use_id", ""), "content": parts or [{"text": ""}]}
    if block.get("is_error"):
        result["status"] = "error"
    return {"toolResult": result}


def _block(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"text": block.get("text", "")}
    if kind == "image":
        return _image(block)
    if kind == "tool_use":
        if not isinstance(block.get("input"), dict):
            raise InvalidRequestError("A tool_use block needs an input object.", param="messages")
        return {
            "toolUse": {
                "toolUseId": block.get("id", ""),
                "name": block.get("name", ""),
                "input": block["input"],
            }
        }
    if kind == "tool_result":
        return _tool_result(block)
    raise unsupported("messages", f"content block type {kind!r} has no Converse equivalent")


def _blocks(blocks: list[dict[str, Any]], points: _Points) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        out.extend(points.after(block, _block(block)))
    return out


def _tool_config(request: Mapping[str, Any], points: _Points) -> dict[str, Any] | None:
    choice = request.get("tool_choice") or {}
    kind = choice.get("type")
    if kind == "none":
        if any(
            isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
            for message in request["messages"]
            for block in message["content"]
        ):
            raise unsupported(
                "tool_choice", "'none' has no Converse equivalent in a conversation with tool calls"
            )
        return None  # without tools the model cannot call one
    tools: list[dict[str, Any]] = []
    for tool in request["tools"]:
        spec: dict[str, Any] = {"name": tool["name"], "inputSchema": {"json": tool["input_schema"]}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        tools.extend(points.after(tool, {"toolSpec": spec}))
    config: dict[str, Any] = {"tools": tools}
    if kind == "any":
        config["toolChoice"] = {"any": {}}
    elif kind == "tool":
        config["toolChoice"] = {"tool": {"name": choice.get("name")}}
    elif kind == "auto":
        config["toolChoice"] = {"auto": {}}
    return config


def _output_config(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body["response_format"]["json_schema"]
    schema: dict[str, Any] = {"schema": orjson.dumps(spec["schema"]).decode()}
    for key in ("name", "description"):
        if isinstance(spec.get(key), str):
            schema[key] = spec[key]
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": schema}}}


def _inference_config(body: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens:
        config["maxTokens"] = max_tokens
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("stop_sequences", "stopSequences"),
    ):
        if request.get(ours) is not None:
            config[theirs] = request[ours]
    return config


def _messages_request(body: Mapping[str, Any], structured_outputs: bool) -> dict[str, Any]:
    stop = body.get("stop")
    if not (
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        # The edge does not check it, and the shared translation would fail on it.
        raise InvalidRequestError("'stop' must be a string or an array of strings.", param="stop")
    try:
        # Converse's inferenceConfig takes temperature and topP together for every model family;
        # a model that refuses the pair says so in its own 400, relayed to the client.
        return to_messages_request(
            body,
            model="",
            default_max_tokens=1,
            structured_outputs=structured_outputs,
            temperature_with_top_p=True,
        )
    except InvalidRequestError as exc:
        # The shared translation names its own provider; this client asked a Bedrock deployment.
        exc.message = exc.message.replace("Anthropic deployments", "Bedrock deployments")
        raise


def to_converse_request(
    body: Mapping[str, Any],
    *,
    model_id: str,
    structured_outputs: bool,
    cache_points: bool,
    min_cache_tokens: int,
    sections: tuple[str, ...] = ALL_SECTIONS,
    stable_chars: int = 0,
    stable_parts: int = 0,
) -> dict[str, Any]:
    """A chat-completions ``body`` as a Converse request body (``body`` is not changed).
    ``cache_points``: place the gateway's own cache points (the client's ``cache_control``
    marks become cache points too); ``sections``: where cache points may go at all
    (:func:`cache_sections`); ``stable_chars``/``stable_parts``: shaping's stable part of
    the system prompt."""
    request = _messages_request(body, structured_outputs)
    if cache_points:
        system = request.get("system")
        stable = split_stable_system(system, stable_chars, stable_parts) if isinstance(system, list) else 0
        place_breakpoints(
            request,
            stable_system_blocks=stable,
            min_tokens=min_cache_tokens,
            ttl="5m",
            late_blocks=late_system_blocks(body.get("messages")),
        )
    # One count in prefix order (tools, system, messages); a section that takes none gets none.
    points, none = _Points(), _Points(0)
    family = model_family(model_id)
    config = _tool_config(request, points if "tools" in sections else none) if request.get("tools") else None
    out: dict[str, Any] = {}
    system_points = points if "system" in sections else none
    system = [part for block in request.get("system") or () for part in _system_block(block, system_points)]
    if system:
        out["system"] = system
    message_points = points if "messages" in sections else none
    out["messages"] = [
        {"role": m["role"], "content": _blocks(m["content"], message_points)} for m in request["messages"]
    ]
    if config is not None:
        out["toolConfig"] = config
    inference = _inference_config(body, request)
    if inference:
        out["inferenceConfig"] = inference
    if request.get("top_k") is not None:
        if family != "anthropic":
            raise unsupported("top_k", "Converse has it only for Anthropic models")
        out["additionalModelRequestFields"] = {"top_k": request["top_k"]}
    if "output_config" in request:
        out["outputConfig"] = _output_config(body)
    return out


def _system_block(block: Mapping[str, Any], points: _Points) -> list[dict[str, Any]]:
    if block.get("type") != "text":
        raise unsupported("messages", "a system message may hold only text in Converse")
    return points.after(block, {"text": block.get("text", "")})
