"""The Responses API's request body as a pydantic model, its ids, and its usage object.

Like :mod:`gateway.api.protocol`, the model only validates (``extra="allow"``): the
gateway forwards or translates the client's own JSON.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
