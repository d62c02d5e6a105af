"""Forwarding SSE streams event by event, reading only what the gateway needs.

The scanner cuts the byte stream at event boundaries (so an event is never split
across two writes to the client) and looks inside an event only when a cheap byte
search says it may hold something of interest: usage, an error, the end marker.
"""

from __future__ import annotations

from typing import Any

import orjson

_DONE = b"data: [DONE]"
_USAGE_MARKERS = (b'"usage":{', b'"usage": {')
_ERROR_MARKERS = (b'{"error"', b'"object":"error"', b'"object": "error"')


class StreamScanner:
    """Feed upstream bytes; get back the bytes to forward now.

    - ``strip_usage``: drop the usage-only chunk (``choices: []``) that the gateway asked
      for on the client's behalf.
    - ``model_from``/``model_to``: rewrite the ``model`` field of each chunk.
    """

    __slots__ = (
        "_model_new",
        "_model_old",
        "_sep",
        "_strip_usage",
        "_tail",
        "done",
        "error",
        "events",
        "usage",
    )

    def __init__(
        self, *, strip_usage: bool = False, model_from: str | None = None, model_to: str | None = None
    ) -> None:
        self._strip_usage = strip_usage
        self._tail = b""
        self._sep = b"\n\n"
        self._model_old: tuple[bytes, ...] = ()
        self._model_new: tuple[bytes, ...] = ()
        if model_from is not None and model_to is not None and model_from != model_to:
            old, new = orjson.dumps(model_from), orjson.dumps(model_to)
            self._model_old = (b'"model":' + old, b'"model": ' + old)
            self._model_new = (b'"model":' + new, b'"model": ' + new)
        self.done = False
        self.events = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        data = self._tail + chunk if self._tail else chunk
        if self.events == 0 and b"\r\n" in data:
            self._sep = b"\r\n\r\n"
        end = data.rfind(self._sep)
        if end < 0:
            self._tail = data
            return b""
        cut = end + len(self._sep)
        block, self._tail = data[:cut], data[cut:]
        self.events += block.count(self._sep)
        if any(m in block for m in _USAGE_MARKERS) or any(m in block for m in _ERROR_MARKERS):
            block = self._inspect(block)
        if not self.done and _DONE in block:
            self.done = True
        if self._model_old:
            for old, new in zip(self._model_old, self._model_new, strict=True):
                block = block.replace(old, new)
        return block

    def _inspect(self, block: bytes) -> bytes:
        kept: list[bytes] = []
        for event in block.split(self._sep):
            if not event:
                continue
            payload = _data_of(event)
            obj = _json_or_none(payload) if payload else None
            if isinstance(obj, dict):
                if obj.get("error") is not None or obj.get("object") == "error":
                    err = obj.get("error")
                    self.error = err if isinstance(err, dict) else obj
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    self.usage = usage
                    if self._strip_usage and not obj.get("choices"):
                        continue
            kept.append(event + self._sep)
        return b"".join(kept)

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a cut-off event)."""
        return self._tail


def _data_of(event: bytes) -> bytes:
    # An event may carry several data lines; OpenAI-style streams use exactly one.
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines)


def _json_or_none(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
