"""Forwarding SSE streams event by event, reading only what the gateway needs.

The scanner cuts the byte stream at event boundaries (so an event is never split
across two writes to the client) and looks inside an event only when a cheap byte
search says it may hold something of interest: usage, an error, the end marker.
"""

from __future__ import annotations

from typing import Any

import orjson

_DONE = b"data: [DONE]"
# A non-null usage object, or an error (`{"error": ...}` or vLLM's `"object": "error"`).
# Escaped quotes inside content (`\"error\"`) never match.
_MARKERS = (b'"usage":{', b'"usage": {', b'"error"')


def _marked(data: bytes) -> bool:
    return _MARKERS[0] in data or _MARKERS[1] in data or _MARKERS[2] in data


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
        "chunks",
        "done",
        "error",
        "malformed",
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
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None

    def feed(self, chunk: bytes) -> bytes:
        data = self._tail + chunk if self._tail else chunk
        if self.chunks == 0:
            newline = data.find(b"\n")
            if newline > 0 and data[newline - 1] == 0x0D:
                self._sep = b"\r\n\r\n"
        sep = self._sep
        end = data.rfind(sep)
        if end < 0:
            self._tail = data
            return b""
        cut = end + len(sep)
        block, self._tail = data[:cut], data[cut:]
        self.chunks += 1
        bad = _first_malformed(block, sep)
        if bad >= 0:
            # Forward what came before it; the caller ends the stream with an error.
            self.malformed = block[bad : bad + 200]
            block = block[:bad]
            cut = len(block)
            if not block:
                return b""
        # Usage, an error and [DONE] end a stream: only the last two events of a block
        # can hold them, so only those are searched (a byte search of a whole 5 KB block
        # costs microseconds; this keeps the scan independent of the block's size).
        last = block.rfind(sep, 0, cut - len(sep))
        if last >= 0:
            last = block.rfind(sep, 0, last)
        head = 0 if last < 0 else last + len(sep)
        tail = block[head:] if head else block
        if _marked(tail):
            kept = self._inspect(tail)
            if kept is not tail:
                block = block[:head] + kept
        if not self.done and _DONE in tail:
            self.done = True
        if self._model_old:
            for old, new in zip(self._model_old, self._model_new, strict=True):
                block = block.replace(old, new)
        return block

    def _inspect(self, events: bytes) -> bytes:
        """Read usage and errors from these (at most two) events; drop the usage chunk if asked."""
        sep = self._sep
        kept: list[bytes] = []
        dropped = False
        for event in events.split(sep):
            if not event:
                continue
            obj = _json_or_none(_data_of(event)) if _marked(event) else None
            if isinstance(obj, dict):
                if obj.get("error") is not None or obj.get("object") == "error":
                    err = obj.get("error")
                    self.error = err if isinstance(err, dict) else obj
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    self.usage = usage
                    if self._strip_usage and not obj.get("choices"):
                        dropped = True
                        continue
            kept.append(event + sep)
        return b"".join(kept) if dropped else events

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a cut-off event)."""
        return self._tail


def _first_malformed(block: bytes, sep: bytes) -> int:
    """Offset of the first event whose data is neither a JSON object nor [DONE], or -1.

    A shape check, not a parse: each event must end with ``}`` (or be ``[DONE]``, or an
    SSE comment). It catches the truncated or garbled events a broken upstream sends,
    at a fraction of a JSON parse's cost per event.
    """
    offset = 0
    for event in block.split(sep):
        if event and event[-1] != 0x7D and event[0] != 0x3A and not event.endswith(b"[DONE]"):
            return offset
        offset += len(event) + len(sep)
    return -1


def _data_of(event: bytes) -> bytes:
    # An event may carry several data lines; OpenAI-style streams use exactly one.
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines)


def _json_or_none(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
