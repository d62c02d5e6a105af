"""OpenAI request bodies as pydantic models, used to validate before anything is sent upstream.

``extra="allow"`` everywhere: a field we do not model is not an error and is passed to
the upstream untouched (the gateway forwards the client's own JSON, not these models).
``strict=True`` so ``"max_tokens": "10"`` is rejected here, with the parameter named,
rather than by the upstream.
"""

from __future__ import annotations

from typing import Any, Literal

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


def validate(schema: type[BaseModel], body: dict[str, Any]) -> None:
    """Raise :class:`InvalidRequestError` naming the first bad parameter."""
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


def _depth_over(body: Any, max_depth: int) -> bool:
    """Whether ``body`` nests objects and arrays deeper than ``max_depth`` (iterative: a deep
    body must not cost a deep Python stack)."""
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


def check_limits(body: dict[str, Any], *, max_depth: int, max_messages: int, max_content_parts: int) -> None:
    """The size limits a body must keep before it is validated or sent anywhere:
    nesting depth, number of messages, content parts per message."""
    if _depth_over(body, max_depth):
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
