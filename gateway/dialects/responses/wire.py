"""The Responses API's request body as a pydantic model, its ids, and its usage object.

Like :mod:`gateway.api.protocol`, the model only validates (``extra="allow"``): the
gateway forwards or translates the client's own JSON.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.api.protocol import plain_numbers


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class InputItem(_Wire):
    type: str | None = None
    role: str | None = None


class ResponsesTool(_Wire):
    type: str


class TextConfig(_Wire):
    format: dict[str, Any] | None = None


class ResponsesRequest(_Wire):
    """``POST /v1/responses``."""

    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None

    @staticmethod
    def plainly_valid(body: dict[str, Any]) -> bool:
        """True when ``body`` is surely valid: the common shape checked by exact type (as
        :func:`gateway.api.protocol.validate` does for chat), a third of pydantic's time or
        less. False means "not sure": pydantic then decides, with its own errors."""
        get = body.get
        model, items = get("model"), get("input")
        if type(model) is not str or not model:
            return False
        if items is not None and type(items) is not str:
            if type(items) is not list:
                return False
            for item in items:
                if type(item) is not dict:
                    return False
                kind, role = item.get("type"), item.get("role")
                if (kind is not None and type(kind) is not str) or (
                    role is not None and type(role) is not str
                ):
                    return False
        for names, kinds in _PLAIN_FIELDS:
            for name in names:
                value = get(name)
                if value is not None and type(value) not in kinds:
                    return False
        tools, text, metadata = get("tools"), get("text"), get("metadata")
        if tools is not None:
            for tool in tools:
                if type(tool) is not dict or type(tool.get("type")) is not str:
                    return False
        if text is not None and text.get("format") is not None and type(text["format"]) is not dict:
            return False
        if metadata is not None:
            for value in metadata.values():
                if type(value) is not str:
                    return False
        return plain_numbers(body, _PLAIN_NUMBERS)


_PLAIN_NUMBERS: dict[str, tuple[int, int | None, bool]] = {
    "max_output_tokens": (1, None, True),
    "temperature": (0, 2, False),
    "top_p": (0, 1, False),
}
_PLAIN_FIELDS: tuple[tuple[tuple[str, ...], tuple[type, ...]], ...] = (
    (("instructions", "previous_response_id", "user"), (str,)),
    (("stream", "store", "parallel_tool_calls"), (bool,)),
    (("reasoning", "text", "metadata"), (dict,)),
    (("tool_choice",), (str, dict)),
    (("tools",), (list,)),
)
"""The fields :meth:`ResponsesRequest.plainly_valid` checks by exact type (None or one of these)."""


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (``resp_…``, ``msg_…``, ``fc_…``): unique, not secret."""
    return f"{prefix}_{random.getrandbits(192):048x}"


def responses_usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat Completions usage as the Responses API's usage object (cached tokens included)."""
    if not chat_usage:
        return None
    prompt = _int(chat_usage.get("prompt_tokens"))
    completion = _int(chat_usage.get("completion_tokens"))
    prompt_details = chat_usage.get("prompt_tokens_details")
    completion_details = chat_usage.get("completion_tokens_details")
    cached = _int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
    reasoning = (
        _int(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else 0
    )
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": _int(chat_usage.get("total_tokens")) or prompt + completion,
    }


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Responses API's usage in Chat Completions' shape, which the gateway's accounting
    (cost, cache-hit stats, limits) reads."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    out_details = usage.get("output_tokens_details")
    prompt = _int(usage.get("input_tokens"))
    completion = _int(usage.get("output_tokens"))
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": _int(usage.get("total_tokens")) or prompt + completion,
    }
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out["prompt_tokens_details"] = {"cached_tokens": details["cached_tokens"]}
    if isinstance(out_details, dict) and isinstance(out_details.get("reasoning_tokens"), int):
        out["completion_tokens_details"] = {"reasoning_tokens": out_details["reasoning_tokens"]}
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
