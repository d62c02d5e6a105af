"""OpenAI request bodies as pydantic models, used to validate before anything is sent upstream.

``extra="allow"`` everywhere: a field we do not model is not an error and is passed to
the upstream untouched (the gateway forwards the client's own JSON, not these models).
``strict=True`` so ``"max_tokens": "10"`` is rejected here, with the parameter named,
rather than by the upstream.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequestError
from gateway.validation import format_loc


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Wire):
    type: str


class FunctionDef(_Wire):
    name: str = Field(min_length=1)


class Tool(_Wire):
    type: str
    function: FunctionDef | None = None


class StreamOptions(_Wire):
    include_usage: bool | None = None


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Wire):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None

    @staticmethod
    def plainly_valid(body: dict[str, Any]) -> bool:
        """:func:`_plainly_valid_chat`: what :func:`validate` tries before pydantic."""
        return _plainly_valid_chat(body)


class CompletionRequest(_Wire):
    model: str = Field(min_length=1)
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)


class EmbeddingRequest(_Wire):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)


_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function"))
_MESSAGE_STRINGS = ("name", "tool_call_id")


def plain_numbers(body: dict[str, Any], ranges: dict[str, tuple[int, int | None, bool]]) -> bool:
    """Whether each numeric field of ``ranges`` present in ``body`` is surely valid: per field
    ``(low, high, whole)``, an int (unless ``whole``, a float too; a JSON integer in a float
    field, such as ``"temperature": 0``, is valid; a bool never) from ``low`` to ``high``
    (None: no top). NaN fails the range, so pydantic decides it."""
    get = body.get
    for name, bounds in ranges.items():
        value = get(name)
        if value is None:
            continue
        low, high, whole = bounds
        if type(value) is not int and (whole or type(value) is not float):
            return False
        if not low <= value or (high is not None and value > high):
            return False
    return True


_PLAIN_NUMBERS: dict[str, tuple[int, int | None, bool]] = {
    "max_tokens": (1, None, True),
    "max_completion_tokens": (1, None, True),
    "n": (1, 128, True),
    "temperature": (0, 2, False),
    "top_p": (0, 1, False),
}


def _plainly_valid_tools(tools: Any) -> bool:
    """Whether a ``tools`` value is surely valid: a list of objects, each with a string
    ``type`` and, if any, a ``function`` object whose ``name`` is a non-empty string (an
    agent's tools, checked in a few lookups each instead of pydantic's model per tool)."""
    if type(tools) is not list:
        return False
    for tool in tools:
        if type(tool) is not dict or type(tool.get("type")) is not str:
            return False
        function = tool.get("function")
        if function is not None:
            if type(function) is not dict:
                return False
            name = function.get("name")
            if type(name) is not str or not name:
                return False
    return True


def _plain_parts(content: Any) -> bool:
    """Whether a message's ``content`` is a list of parts, each an object with a string
    ``type`` (text, images, and what the Anthropic Messages API's blocks become)."""
    return type(content) is list and all(type(p) is dict and type(p.get("type")) is str for p in content)


def _plainly_valid_chat(body: dict[str, Any]) -> bool:
    """True when a chat body is surely valid for :class:`ChatCompletionRequest`: the common
    shape (text or typed parts, plain-typed options, a deterministic ``"temperature": 0``)
    checked by exact type in a few lookups, a quarter of pydantic's time. False means "not
    sure", never "invalid": pydantic then decides, so the errors are its own, unchanged."""
    model = body.get("model")
    messages = body.get("messages")
    if type(model) is not str or not model or type(messages) is not list or not messages:
        return False
    for message in messages:
        if type(message) is not dict or message.get("role") not in _ROLES:
            return False
        content = message.get("content")
        if content is not None and type(content) is not str and not _plain_parts(content):
            return False
        if len(message) > 2:
            for name in _MESSAGE_STRINGS:
                value = message.get(name)
                if value is not None and type(value) is not str:
                    return False
    # Stream options as SDKs send them (``{"include_usage": true}``).
    options = body.get("stream_options")
    usage = options.get("include_usage", False) if type(options) is dict else None
    if options is not None and type(usage) is not bool:
        return False
    tools = body.get("tools")
    if tools is not None and not _plainly_valid_tools(tools):
        return False
    if not plain_numbers(body, _PLAIN_NUMBERS):
        return False
    stream, user = body.get("stream"), body.get("user")
    if (stream is not None and type(stream) is not bool) or (user is not None and type(user) is not str):
        return False
    for name in ("metadata", "response_format"):
        value = body.get(name)
        if value is not None and type(value) is not dict:
            return False
    choice = body.get("tool_choice")
    return choice is None or type(choice) is str or type(choice) is dict


def validate(schema: type[BaseModel], body: dict[str, Any]) -> None:
    """Raise :class:`InvalidRequestError` naming the first bad parameter."""
    quick = getattr(schema, "plainly_valid", None)  # a schema's own quick check, if it has one
    if quick is not None and quick(body):
        return
    try:
        schema.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        param = format_loc(_body_loc(body, err["loc"], missing=err["type"] == "missing"))
        if err["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {err['msg']}."
        raise InvalidRequestError(message, param=param, code="invalid_value") from None


def _body_loc(body: Any, loc: tuple[int | str, ...], missing: bool) -> tuple[int | str, ...]:
    """The error's location in the client's JSON, without the union-member tags pydantic adds
    (``('messages', 0, 'content', 'str')`` -> ``('messages', 0, 'content')``)."""
    out: list[int | str] = []
    node = body
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and (part in node or (missing and i == last)):
            out.append(part)
            node = node.get(part)
    return tuple(out)


_NESTED = (dict, list)


def _depth_over(body: Any, max_depth: int) -> bool:
    """Whether ``body`` nests objects and arrays deeper than ``max_depth``."""
    return _levels(body, max_depth) > max_depth


def _levels(node: Any, cap: int | None = None) -> int:
    """How many levels of objects and arrays ``node`` nests (1: no container inside it),
    counted up to ``cap + 1`` at most. Iterative, one level at a time: a deep body must not
    cost a deep Python stack, and a level's loop is a third of the cost of a stack of
    (node, depth) pairs."""
    level: list[Any] = [node]
    depth = 0
    while level:
        depth += 1
        if cap is not None and depth > cap:
            break
        deeper: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
            # A plain loop: a comprehension per node costs more than it saves on small nodes.
            for child in children:
                if isinstance(child, _NESTED):
                    deeper.append(child)  # noqa: PERF401
        level = deeper
    return depth


_TOOL_LEVELS: dict[bytes, int] = {}
_TOOL_LEVELS_KEPT = 256
_TOOL_LEVELS_MAX_BYTES = 1 << 16


def _body_depth_over(body: dict[str, Any], max_depth: int) -> tuple[bool, bytes | None]:
    """:func:`_depth_over` for a request body, and its tool list's compact JSON (None without
    one). An agent sends the same tools on every request and their schemas are most of a
    body's objects, so their depth is remembered by their JSON (writing it is C speed, a
    quarter of the walk's cost)."""
    tools = body.get("tools")
    if type(tools) is not list or not tools:
        return _depth_over(body, max_depth), None
    if _depth_over({k: v for k, v in body.items() if k != "tools"}, max_depth):
        return True, None
    try:
        key = orjson.dumps(tools)
    except orjson.JSONEncodeError:  # deeper than orjson writes (255 levels), or not JSON at all
        return _depth_over(tools, max_depth - 1), None
    levels = _TOOL_LEVELS.get(key)
    if levels is None:
        levels = _levels(tools)
        if len(key) <= _TOOL_LEVELS_MAX_BYTES:
            if len(_TOOL_LEVELS) >= _TOOL_LEVELS_KEPT:
                _TOOL_LEVELS.clear()
            _TOOL_LEVELS[key] = levels
    return 1 + levels > max_depth, key


def check_limits(
    body: dict[str, Any], *, max_depth: int, max_messages: int, max_content_parts: int
) -> bytes | None:
    """The size limits a body must keep before it is validated or sent anywhere:
    nesting depth, number of messages, content parts per message. Returns the body's tool
    list as compact JSON (None without one), written for the depth check: shaping and
    routing read it instead of writing it again (an agent's 20 tools: ~11 µs each time)."""
    over, tools_json = _body_depth_over(body, max_depth)
    if over:
        raise InvalidRequestError(
            f"The request body nests objects and arrays deeper than {max_depth} levels.",
            code="json_too_deep",
        )
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > max_messages:
            raise InvalidRequestError(
                f"Invalid 'messages': array too long. Expected an array with at most {max_messages} "
                f"elements, but got {len(messages)}.",
                param="messages",
                code="array_above_max_length",
            )
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and len(content) > max_content_parts:
                raise InvalidRequestError(
                    f"Invalid 'messages[{i}].content': array too long. Expected at most "
                    f"{max_content_parts} content parts, but got {len(content)}.",
                    param=f"messages[{i}].content",
                    code="array_above_max_length",
                )
    return tools_json
