"""Anthropic Messages -> OpenAI chat completions: the answer, its usage, its stream.

Usage: Anthropic counts ``input_tokens`` *without* the cached parts, OpenAI counts them
inside ``prompt_tokens``. So ``prompt_tokens = input + cache_read + cache_creation``,
``prompt_tokens_details.cached_tokens = cache_read`` and the writes are kept as
``prompt_tokens_details.cache_write_tokens`` (``cache_write_1h_tokens`` the 1-hour share)
for :mod:`gateway.cachestats.cost`, which charges them at their premium.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.providers.sse import closing_events, complete_events, event_data

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}
"""Anthropic ``stop_reason`` -> OpenAI ``finish_reason``."""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``usage`` object in OpenAI's shape (see the module docstring)."""
    uncached = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    output = _int(usage.get("output_tokens"))
    prompt = uncached + read + written
    details: dict[str, Any] = {"cached_tokens": read, "cache_write_tokens": written}
    creation = usage.get("cache_creation")
    if isinstance(creation, dict) and _int(creation.get("ephemeral_1h_input_tokens")):
        details["cache_write_1h_tokens"] = _int(creation.get("ephemeral_1h_input_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": details,
    }


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": block.get("id", ""),
        "type": "function",
        "function": {
            "name": block.get("name", ""),
            "arguments": orjson.dumps(block.get("input") or {}).decode(),
        },
    }


def to_chat_completion(message: dict[str, Any], model: str | None) -> dict[str, Any]:
    """A Messages API answer as a ``chat.completion`` object."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(_tool_call(block))
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        reply["tool_calls"] = calls
    usage = message.get("usage")
    return {
        "id": message.get("id", ""),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or message.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": STOP_REASONS.get(str(message.get("stop_reason")), "stop"),
                **_stop_sequence(message.get("stop_reason"), message.get("stop_sequence")),
            }
        ],
        "usage": openai_usage(usage) if isinstance(usage, dict) else None,
    }


def _stop_sequence(reason: Any, sequence: Any) -> dict[str, Any]:
    """The stop sequence that ended the answer as a chat choice's ``stop_reason`` (vLLM's
    field for the stop string that matched), so /v1/messages can report it back."""
    if reason == "stop_sequence" and isinstance(sequence, str):
        return {"stop_reason": sequence}
    return {}


def openai_error(event: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic error object (``{"type": "error", "error": {...}}``) in OpenAI's shape."""
    inner = event.get("error")
    err: dict[str, Any] = inner if isinstance(inner, dict) else event
    kind = str(err.get("type") or "api_error")
    return {"error": {"message": str(err.get("message") or kind), "type": kind, "param": None, "code": kind}}


class MessagesStreamScanner:
    """The :class:`~gateway.providers.base.Scanner` of an Anthropic stream: each event
    parsed (a translation has to read them) and forwarded as OpenAI chunks, ``[DONE]``
    after ``message_stop``."""

    __slots__ = (
        "_created",
        "_finish",
        "_id",
        "_model",
        "_strip_usage",
        "_tail",
        "_tool_index",
        "_tools",
        "_usage",
        "chunks",
        "done",
        "error",
        "malformed",
        "start_usage",
        "usage",
    )

    def __init__(self, *, strip_usage: bool, shown_model: str | None) -> None:
        self._strip_usage = strip_usage
        self._model = shown_model
        self._tail = b""
        self._id = ""
        self._created = int(time.time())
        self._usage: dict[str, Any] = {}
        self._tools: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index
        self._tool_index = 0
        self._finish: str | None = None
        self.done = False
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None
        self.start_usage: dict[str, Any] | None = None
        """The usage ``message_start`` reported (Anthropic's shape: the input tokens are
        known before the first token), for /v1/messages to report as early."""

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event."""
        return self._tail

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the OpenAI chunks they complete."""
        events, self._tail = complete_events(self._tail, chunk)
        out: list[bytes] = []
        for event in events:
            if self.malformed is not None:
                continue
            payload = event_data(event)
            if not payload:
                continue  # a comment or an event name alone
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self.malformed = event[:200]
                break
            if isinstance(obj, dict):
                out.extend(self._translate(obj))
        if out:
            self.chunks += 1
        return b"".join(out)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        obj = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _translate(self, event: dict[str, Any]) -> list[bytes]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = str(message.get("id", ""))
            if self._model is None:
                self._model = message.get("model")
            self._usage.update(message.get("usage") or {})
            self.start_usage = dict(self._usage)
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self._tools[int(event.get("index", 0))] = self._tool_index
                self._tool_index += 1
                call = {"index": index, **_tool_call({**block, "input": {}})}
                call["function"]["arguments"] = ""
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta":
                index = self._tools.get(int(event.get("index", 0)), 0)
                arguments = {"index": index, "function": {"arguments": delta.get("partial_json", "")}}
                return [self._chunk({"tool_calls": [arguments]})]
            return []  # thinking and signature deltas have no chat-completions equivalent
        if kind == "message_delta":
            self._usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            delta = event.get("delta") or {}
            reason = delta.get("stop_reason")
            self._finish = STOP_REASONS.get(str(reason), "stop")
            return [self._chunk({}, self._finish, **_stop_sequence(reason, delta.get("stop_sequence")))]
        if kind == "message_stop":
            self.done = True
            self.usage = openai_usage(self._usage)
            return closing_events(
                self._id, self._created, self._model, self.usage, strip_usage=self._strip_usage
            )
        if kind == "error":
            translated = openai_error(event)
            self.error = translated["error"]
            return [b"data: " + orjson.dumps(translated) + b"\n\n"]
        return []  # ping, and event types added later
