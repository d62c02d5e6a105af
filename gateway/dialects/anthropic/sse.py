"""A chat-completions stream (OpenAI chunks, ``[DONE]`` last) as Anthropic's SSE events:
``message_start``, ``content_block_start``/``_delta``/``_stop`` (text and tool use, with
``input_json_delta`` for arguments), ``message_delta`` (stop reason, usage), ``message_stop``;
an error event becomes Anthropic's ``error`` event."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects.anthropic.inbound import anthropic_usage, message_id, stop_of
from gateway.providers.sse import complete_events, event_data


def event(kind: str, payload: dict[str, Any]) -> bytes:
    """One Anthropic SSE event."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **payload}) + b"\n\n"


class ChunksToEvents:
    """Feed the chat stream's bytes (whole events, as dispatch forwards them); get events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._started = False
        self._open: tuple[str, int] | None = None  # ("text" | "tool", OpenAI tool index)
        self._index = -1
        self._stop: tuple[str, str | None] = ("end_turn", None)
        self.start_usage: dict[str, Any] | None = None
        """The usage an Anthropic upstream reported at its start (set before the first
        event goes out): ``message_start`` then carries its input tokens, as Anthropic's does."""
        self._usage: dict[str, Any] | None = None
        self._tail = b""
        self.finished = False
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """Translate the complete events in ``data``."""
        events, self._tail = complete_events(self._tail, data)
        out: list[bytes] = []
        for raw in events:
            payload = event_data(raw)
            if payload == b"[DONE]":
                out.append(self.finish())
            elif payload:
                try:
                    obj = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    out.extend(self._chunk(obj))
        return b"".join(out)

    def _start(self, obj: dict[str, Any]) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": message_id(obj.get("id")),
            "type": "message",
            "role": "assistant",
            "model": obj.get("model") or self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0, **(self.start_usage or {})},
        }
        return [event("message_start", {"message": message})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"index": self._index})]

    def _chunk(self, obj: dict[str, Any]) -> list[bytes]:
        if obj.get("error") is not None:
            err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return [self.error_event(str(err.get("message", "upstream error")), str(err.get("type") or ""))]
        out = self._start(obj)
        if isinstance(obj.get("usage"), dict):
            self._usage = obj["usage"]
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self._open is None or self._open[0] != "text":
                    out += self._close()
                    self._index += 1
                    self._open = ("text", -1)
                    block = {"index": self._index, "content_block": {"type": "text", "text": ""}}
                    out.append(event("content_block_start", block))
                text_delta = {"type": "text_delta", "text": delta["content"]}
                out.append(event("content_block_delta", {"index": self._index, "delta": text_delta}))
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self._stop = stop_of(choice)
        return out

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        function = call.get("function") or {}
        which = int(call.get("index", 0))
        if self._open != ("tool", which):
            out += self._close()
            self._index += 1
            self._open = ("tool", which)
            block = {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": {},
            }
            out.append(event("content_block_start", {"index": self._index, "content_block": block}))
        if function.get("arguments"):
            json_delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(event("content_block_delta", {"index": self._index, "delta": json_delta}))
        return out

    def finish(self) -> bytes:
        """The closing events (at ``[DONE]``)."""
        if self.finished:
            return b""
        self.finished = True
        out = self._start({})
        out += self._close()
        usage = anthropic_usage(self._usage)
        delta = {"delta": {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]}, "usage": usage}
        out += [event("message_delta", delta), event("message_stop", {})]
        return b"".join(out)

    def error_event(self, message: str, kind: str = "") -> bytes:
        """An ``error`` event that ends the stream."""
        known = (
            "overloaded_error",
            "rate_limit_error",
            "api_error",
            "invalid_request_error",
            "timeout_error",
        )
        self.error = {"type": kind if kind in known else "api_error", "message": message}
        return event("error", {"error": self.error})
