"""Bedrock Converse -> OpenAI chat completions: the answer, its usage, its stream, its errors.

Usage: like Anthropic, Converse counts ``inputTokens`` *without* the cached parts, so
``prompt_tokens = inputTokens + cacheReadInputTokens + cacheWriteInputTokens``,
``prompt_tokens_details.cached_tokens = cacheReadInputTokens`` and the writes go to
``cache_write_tokens`` (:func:`gateway.dialects.anthropic.response.openai_usage` does the sum).

A ConverseStream answer is :mod:`~gateway.dialects.bedrock.eventstream` frames whose
``:event-type`` names the event (``messageStart``, ``contentBlockStart``,
``contentBlockDelta``, ``contentBlockStop``, ``messageStop``, then ``metadata`` with the
usage, which ends it) and whose JSON payload is that event's body. A frame with
``:message-type: exception`` (``throttlingException``, ``modelStreamErrorException`` ...) or
``error`` is an error event; a frame whose CRC does not match is a malformed stream.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from gateway.dialects.anthropic.response import openai_usage
from gateway.dialects.bedrock.eventstream import EventMessage, EventStreamDecoder, EventStreamError
from gateway.providers.sse import closing_events

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
    "model_context_window_exceeded": "length",
}
"""Converse ``stopReason`` -> OpenAI ``finish_reason``."""

ERROR_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
"""HTTP status -> the OpenAI error ``type`` a relayed Bedrock error carries (else ``api_error``)."""


def openai_usage_of(usage: dict[str, Any]) -> dict[str, Any]:
    """A Converse ``usage`` object in OpenAI's shape (see the module docstring)."""
    return openai_usage(
        {
            "input_tokens": usage.get("inputTokens"),
            "output_tokens": usage.get("outputTokens"),
            "cache_read_input_tokens": usage.get("cacheReadInputTokens"),
            "cache_creation_input_tokens": usage.get("cacheWriteInputTokens"),
        }
    )


def error_body(kind: str, message: str, status: int) -> dict[str, Any]:
    """A Bedrock error (``ThrottlingException`` and its message) as OpenAI's error object."""
    return {
        "error": {
            "message": f"{kind}: {message}" if message else kind,
            "type": ERROR_TYPES.get(status, "api_error"),
            "param": None,
            "code": kind,
        }
    }


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` when ``obj`` is an object, else ``None`` (an answer of an odd shape is
    read as far as it goes, never a traceback)."""
    return obj.get(name) if isinstance(obj, dict) else None


def _block_index(event: dict[str, Any]) -> int:
    index = event.get("contentBlockIndex")
    return index if isinstance(index, int) else 0


def completion_id() -> str:
    """An id for an answer (Converse answers carry none)."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def to_chat_completion(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """A Converse answer as a ``chat.completion`` object."""
    content = _field(_field(answer.get("output"), "message"), "content")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            arguments = orjson.dumps(use.get("input") if use.get("input") is not None else {}).decode()
            calls.append(
                {
                    "id": use.get("toolUseId", ""),
                    "type": "function",
                    "function": {"name": use.get("name", ""), "arguments": arguments},
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        reply["tool_calls"] = calls
    usage = answer.get("usage")
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": STOP_REASONS.get(str(answer.get("stopReason")), "stop"),
            }
        ],
        "usage": openai_usage_of(usage) if isinstance(usage, dict) else None,
    }


class ConverseStreamScanner:
    """The :class:`~gateway.providers.base.Scanner` of a ConverseStream answer: frames
    decoded and CRC-checked, each event forwarded as OpenAI chunks, ``[DONE]`` after
    ``metadata``."""

    __slots__ = (
        "_created",
        "_decoder",
        "_id",
        "_model",
        "_strip_usage",
        "_tool_index",
        "_tools",
        "chunks",
        "done",
        "error",
        "malformed",
        "usage",
    )

    def __init__(self, *, strip_usage: bool, model: str) -> None:
        self._strip_usage = strip_usage
        self._model = model
        self._decoder = EventStreamDecoder()
        self._id = completion_id()
        self._created = int(time.time())
        self._tools: dict[int, int] = {}  # Converse contentBlockIndex -> OpenAI tool_calls index
        self._tool_index = 0
        self.done = False
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None

    @property
    def pending(self) -> bytes:
        """Bytes of a frame not complete yet."""
        return self._decoder.pending

    def feed(self, chunk: bytes) -> bytes:
        """Take upstream bytes; return the OpenAI chunks their complete frames make."""
        if self.malformed is not None or self.done:
            return b""
        try:
            messages = self._decoder.feed(chunk)
        except EventStreamError as exc:
            self.malformed = f"a corrupt event-stream frame ({exc})".encode()
            return b""
        out: list[bytes] = []
        for message in messages:
            out.extend(self._translate(message))
            if self.malformed is not None or self.done:
                break
        if out:
            self.chunks += 1
        return b"".join(out)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _translate(self, message: EventMessage) -> list[bytes]:
        kind = message.header(":message-type") or "event"
        if kind != "event":
            name = message.header(":exception-type") or message.header(":error-code") or "streamError"
            return self._error(name, message)
        try:
            event = orjson.loads(message.payload) if message.payload else {}
        except orjson.JSONDecodeError:
            self.malformed = message.payload[:200]
            return []
        if not isinstance(event, dict):
            self.malformed = message.payload[:200]
            return []
        return self._event(message.header(":event-type"), event)

    def _event(self, name: str, event: dict[str, Any]) -> list[bytes]:
        if name == "messageStart":
            return [self._chunk({"role": "assistant", "content": ""})]
        if name == "contentBlockStart":
            use = _field(event.get("start"), "toolUse")
            if not isinstance(use, dict):
                return []
            index = self._tools[_block_index(event)] = self._tool_index
            self._tool_index += 1
            call = {
                "index": index,
                "id": use.get("toolUseId", ""),
                "type": "function",
                "function": {"name": use.get("name", ""), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if name == "contentBlockDelta":
            delta = event.get("delta")
            text = _field(delta, "text")
            if isinstance(text, str):
                return [self._chunk({"content": text})]
            use = _field(delta, "toolUse")
            if isinstance(use, dict):
                # The arguments go on exactly as the model wrote them, fragment by fragment.
                index = self._tools.get(_block_index(event), 0)
                arguments = {"index": index, "function": {"arguments": str(use.get("input", ""))}}
                return [self._chunk({"tool_calls": [arguments]})]
            return []  # reasoning and citations have no chat-completions equivalent
        if name == "messageStop":
            return [self._chunk({}, STOP_REASONS.get(str(event.get("stopReason")), "stop"))]
        if name == "metadata":
            usage = event.get("usage")
            self.usage = openai_usage_of(usage if isinstance(usage, dict) else {})
            self.done = True
            return closing_events(
                self._id, self._created, self._model, self.usage, strip_usage=self._strip_usage
            )
        return []  # contentBlockStop, and event types added later

    def _error(self, name: str, message: EventMessage) -> list[bytes]:
        try:
            payload = orjson.loads(message.payload) if message.payload else {}
        except orjson.JSONDecodeError:
            payload = {}
        text = payload.get("message") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            text = message.header(":error-message") or message.payload[:200].decode("utf-8", "replace")
        # A stream exception is named in lower camel case (throttlingException): shown as the
        # HTTP error of the same name.
        kind = name[:1].upper() + name[1:]
        status = 429 if kind == "ThrottlingException" else 500
        translated = error_body(kind, text, status)
        self.error = translated["error"]
        return [b"data: " + orjson.dumps(translated) + b"\n\n"]
