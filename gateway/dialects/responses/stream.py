"""A streamed Chat Completions answer as the Responses API's typed SSE events.

:class:`ChatToResponsesScanner` is a stream scanner (:class:`gateway.providers.base.Scanner`):
the provider's own scanner cuts the chat stream into whole events and reads its usage and
errors; this one turns each chat chunk into the events OpenAI sends for the same answer
(``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ``...done``, ``response.completed``), and keeps
the finished ``response`` object for the store.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.dialects.responses.answer import (
    finish_status,
    function_call_item,
    message_item,
    reasoning_item,
    response_shell,
)
from gateway.dialects.responses.wire import new_id, responses_usage
from gateway.errors import SwitchyardError
from gateway.providers.base import Scanner


def sse_event(payload: dict[str, Any]) -> bytes:
    """One typed SSE event (``event:`` names the ``type``, as OpenAI sends them)."""
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class _Item:
    __slots__ = ("call_id", "id", "index", "kind", "name", "text")

    def __init__(self, kind: str, item_id: str, index: int, name: str = "", call_id: str = "") -> None:
        self.kind = kind
        self.id = item_id
        self.index = index
        self.name = name
        self.call_id = call_id
        self.text: list[str] = []


class ChatToResponsesScanner:
    """Translates one chat stream, as its whole events arrive, into Responses events."""

    def __init__(self, request: dict[str, Any], inner: Scanner, shown_model: str | None) -> None:
        self._request = request
        self._inner = inner
        self._shown_model = shown_model
        self._response: dict[str, Any] | None = None
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._finish_reason: str | None = None
        self.sequence_number = 0
        self.done = False
        self.malformed: bytes | None = None
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.final_response: dict[str, Any] | None = None
        """The finished ``response`` object (for the store), once the stream completed."""

    @property
    def pending(self) -> bytes:
        return self._inner.pending

    def error_event(self, error: SwitchyardError) -> bytes:
        """The ``error`` event that ends this stream when it breaks after it started."""
        return self._emit(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )

    def feed(self, chunk: bytes) -> bytes:
        inner = self._inner
        block = inner.feed(chunk)
        self.malformed, self.chunks, self.usage, self.error = (
            inner.malformed,
            inner.chunks,
            inner.usage,
            inner.error,
        )
        if not block or self.done:
            return b""
        out: list[bytes] = []
        for line in block.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.append(self._complete())
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(self._chunk(obj))
            if self.done:
                break
        return b"".join(out)

    def _emit(self, payload: dict[str, Any]) -> bytes:
        payload = {"type": payload["type"], "sequence_number": self.sequence_number, **payload}
        self.sequence_number += 1
        return sse_event(payload)

    def _start(self, obj: dict[str, Any]) -> bytes:
        model = self._shown_model or str(obj.get("model") or self._request.get("model", ""))
        created = obj.get("created")
        self._response = response_shell(
            self._request, new_id("resp"), model, created if isinstance(created, int) else time.time()
        )
        return self._emit({"type": "response.created", "response": self._response}) + self._emit(
            {"type": "response.in_progress", "response": self._response}
        )

    def _chunk(self, obj: dict[str, Any]) -> bytes:
        out = b"" if self._response is not None else self._start(obj)
        if obj.get("error") is not None or obj.get("object") == "error":
            err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
            assert isinstance(err, dict)
            return out + self._fail(str(err.get("message") or "upstream error"), err.get("code"))
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                out += self._text("reasoning", reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                out += self._text("message", content)
            for call in delta.get("tool_calls") or ():
                out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _text(self, kind: str, piece: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != kind:
            out += self._close_open()
            item = self._open = _Item(kind, new_id("rs" if kind == "reasoning" else "msg"), len(self._items))
            self._items.append(item)
            out += self._emit(
                {
                    "type": "response.output_item.added",
                    "output_index": item.index,
                    "item": self._item(item, "in_progress", partial=True),
                }
            )
            out += self._emit(
                {
                    "type": "response.content_part.added",
                    "item_id": item.id,
                    "output_index": item.index,
                    "content_index": 0,
                    "part": self._part(kind, ""),
                }
            )
        item.text.append(piece)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        event: dict[str, Any] = {
            "type": name,
            "item_id": item.id,
            "output_index": item.index,
            "content_index": 0,
            "delta": piece,
        }
        if kind == "message":
            event["logprobs"] = []
        return out + self._emit(event)

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            out += self._close_open()
            item = _Item(
                "function_call",
                new_id("fc"),
                len(self._items),
                name=str(function.get("name") or ""),
                call_id=str(call.get("id") or new_id("call")),
            )
            self._items.append(item)
            self._calls[index] = item
            self._open = item
            out += self._emit(
                {
                    "type": "response.output_item.added",
                    "output_index": item.index,
                    "item": self._item(item, "in_progress", partial=True),
                }
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.text.append(arguments)
            out += self._emit(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.id,
                    "output_index": item.index,
                    "delta": arguments,
                }
            )
        return out

    def _part(self, kind: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, item: _Item, status: str, partial: bool = False) -> dict[str, Any]:
        text = "" if partial else "".join(item.text)
        if item.kind == "function_call":
            return function_call_item(item.id, item.call_id, item.name, text, status)
        if item.kind == "reasoning":
            body = reasoning_item(item.id, text)
            if partial:
                body["content"] = []
            return body
        body = message_item(item.id, text, status)
        if partial:
            body["content"] = []
        return body

    def _close_open(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        text = "".join(item.text)
        out = b""
        if item.kind == "function_call":
            out += self._emit(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item.id,
                    "output_index": item.index,
                    "name": item.name,
                    "arguments": text,
                }
            )
        else:
            done_type = (
                "response.reasoning_text.done" if item.kind == "reasoning" else "response.output_text.done"
            )
            done: dict[str, Any] = {
                "type": done_type,
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "text": text,
            }
            if item.kind == "message":
                done["logprobs"] = []
            out += self._emit(done)
            out += self._emit(
                {
                    "type": "response.content_part.done",
                    "item_id": item.id,
                    "output_index": item.index,
                    "content_index": 0,
                    "part": self._part(item.kind, text),
                }
            )
        return out + self._emit(
            {
                "type": "response.output_item.done",
                "output_index": item.index,
                "item": self._item(item, "completed"),
            }
        )

    def _complete(self) -> bytes:
        out = b"" if self._response is not None else self._start({})
        # Chat streams parallel tool calls one after the other: only the last is still open.
        out += self._close_open()
        response = self._response
        assert response is not None
        response["output"] = [self._item(item, "completed") for item in self._items]
        finish_status(response, self._finish_reason)
        response["usage"] = responses_usage(self._inner.usage)
        self.final_response = response
        self.done = True
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return out + self._emit({"type": kind, "response": response})

    def _fail(self, message: str, code: Any) -> bytes:
        response = self._response
        assert response is not None
        response["status"] = "failed"
        response["error"] = {"code": str(code or "server_error"), "message": message}
        self.done = True
        return self._emit(
            {"type": "error", "code": str(code or "server_error"), "message": message, "param": None}
        ) + self._emit({"type": "response.failed", "response": response})
