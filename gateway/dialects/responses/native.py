"""Reading a Responses API stream passed through from an upstream that serves it.

The stream is typed SSE events ending with ``response.completed`` (or ``.incomplete``,
``.failed``, or an ``error`` event); there is no ``[DONE]``. The scanner cuts it at event
boundaries, checks that every event's data is a JSON object (as chat events are checked:
a malformed one fails the attempt before the first byte, and ends the stream with an
``error`` event after it), rewrites ``model`` when asked, and reads the terminal events
(usage and the finished ``response`` for the store).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects.responses.stream import sse_event
from gateway.dialects.responses.wire import chat_usage
from gateway.errors import SwitchyardError
from gateway.providers.sse import event_data

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class NativeResponsesScanner:
    """Feed upstream bytes of a Responses stream; get back the bytes to forward now."""

    def __init__(
        self,
        *,
        model_from: str | None = None,
        model_to: str | None = None,
        previous_response_id: str | None = None,
    ) -> None:
        self._tail = b""
        self._sep = b"\n\n"
        self._model_to = model_to
        self._model: list[tuple[bytes, bytes]] = []
        if model_from is not None and model_to is not None and model_from != model_to:
            old, new = orjson.dumps(model_from), orjson.dumps(model_to)
            self._model = [(b'"model":' + old, b'"model":' + new), (b'"model": ' + old, b'"model": ' + new)]
        self._previous_id = previous_response_id
        self._replace = list(self._model)
        if previous_response_id is not None:
            # The gateway sent the conversation as input items: the client still sees its id.
            shown = orjson.dumps(previous_response_id)
            self._replace += [
                (b'"previous_response_id":null', b'"previous_response_id":' + shown),
                (b'"previous_response_id": null', b'"previous_response_id": ' + shown),
            ]
        self.done = False
        self.chunks = 0
        self.events = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None
        self.final_response: dict[str, Any] | None = None
        """The finished ``response`` object (for the store), once the stream completed."""

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a cut-off event)."""
        return self._tail

    def error_event(self, error: SwitchyardError) -> bytes:
        """The ``error`` event that ends this stream when it breaks after it started."""
        return sse_event(
            {
                "type": "error",
                "sequence_number": self.events,
                "code": error.code,
                "message": error.message,
                "param": error.param,
            }
        )

    def feed(self, chunk: bytes) -> bytes:
        if self.malformed is not None:
            return b""  # nothing after a malformed event is forwarded
        data = self._tail + chunk if self._tail else chunk
        if self.chunks == 0 and b"\r\n" in data[:200]:
            self._sep = b"\r\n\r\n"
        end = data.rfind(self._sep)
        if end < 0:
            self._tail = data
            return b""
        cut = end + len(self._sep)
        block, self._tail = data[:cut], data[cut:]
        self.chunks += 1
        kept: list[bytes] = []
        for event in block.split(self._sep):
            if not event:
                continue
            payload = event_data(event)
            if payload is None:  # a comment or an event without data: passed through
                kept.append(event + self._sep)
                continue
            # Every event's data must be a JSON object (one parse, as chat events get): one
            # that only looks like one reaches the client's SDK as a raw JSONDecodeError.
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict):
                self.malformed = event[:200]
                self._tail = b""
                break
            self.events += 1
            if obj.get("type") in _TERMINAL or obj.get("type") == "error":
                self._inspect(obj)
            kept.append(event + self._sep)
        out = b"".join(kept)
        for old, new in self._replace:
            out = out.replace(old, new)
        return out

    def _inspect(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "error":
            self.error = obj
            self.done = True
            return
        response = obj.get("response")
        if isinstance(response, dict):
            self.done = True
            self.usage = chat_usage(response.get("usage"))
            if kind == "response.failed":
                self.error = response.get("error") or {"code": "response_failed"}
            else:
                if self._model:
                    response["model"] = self._model_to
                if self._previous_id is not None:
                    response["previous_response_id"] = self._previous_id
                self.final_response = response
