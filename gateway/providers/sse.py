"""Forwarding SSE streams event by event, each one checked before it is forwarded.

The scanner cuts the byte stream at event boundaries (so an event is never split across
two writes to the client) and parses every event's data: it must be a complete JSON
object, or the end marker ``[DONE]``. The end of a stream is that event itself, never
the bytes ``data: [DONE]`` found inside an event's JSON (a model explaining SSE writes
them in its answer). Parsing is one ``orjson.loads`` per event, about a microsecond for
a typical 200-byte chunk (``bench/probes/sse_parse_cost.py``), which also reads usage and errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

_DONE = b"[DONE]"


class StreamScanner:
    """Feed upstream bytes; get back the bytes to forward now.

    - ``strip_usage``: drop the usage-only chunk (``choices: []``) that the gateway asked
      for on the client's behalf.
    - ``model_from``/``model_to``: rewrite the ``model`` field of each chunk.
    - ``usage_of``: where a provider puts a chunk's usage when not in ``usage`` (and in
      OpenAI's shape); the chunk is forwarded as it came.

    After ``[DONE]`` nothing more is forwarded. An event whose data is not a JSON object
    sets :attr:`malformed` and is not forwarded (nor is anything after it).
    """

    __slots__ = (
        "_model_new",
        "_model_old",
        "_sep",
        "_strip_usage",
        "_tail",
        "_usage_of",
        "chunks",
        "done",
        "error",
        "events",
        "malformed",
        "usage",
    )

    def __init__(
        self,
        *,
        strip_usage: bool = False,
        model_from: str | None = None,
        model_to: str | None = None,
        usage_of: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        self._strip_usage = strip_usage
        self._usage_of = usage_of
        self._tail = b""
        self._sep = b"\n\n"
        self._model_old: tuple[bytes, ...] = ()
        self._model_new: tuple[bytes, ...] = ()
        if model_from is not None and model_to is not None:
            self.rewrite_model(model_from, model_to)
        self.done = False
        self.chunks = 0
        self.events = 0
        """JSON events seen (``[DONE]`` and comments not counted)."""
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.malformed: bytes | None = None

    def rewrite_model(self, model_from: str, model_to: str) -> None:
        """From now on, rewrite ``"model": model_from`` to ``model_to`` in what is forwarded."""
        if model_from == model_to:
            return
        old, new = orjson.dumps(model_from), orjson.dumps(model_to)
        self._model_old = (b'"model":' + old, b'"model": ' + old)
        self._model_new = (b'"model":' + new, b'"model": ' + new)

    def feed(self, chunk: bytes) -> bytes:
        if self.done or self.malformed is not None:
            return b""
        data = self._tail + chunk if self._tail else chunk
        if self.chunks == 0 and self.events == 0:
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
        out = self._check(block, sep)
        if self._model_old and out:
            for old, new in zip(self._model_old, self._model_new, strict=True):
                out = out.replace(old, new)
        return out

    def _check(self, block: bytes, sep: bytes) -> bytes:
        """The part of ``block`` (complete events) to forward: every event up to the first
        bad one or ``[DONE]`` (included), without a usage chunk the client did not ask for."""
        offset = 0
        kept_from = 0
        pieces: list[bytes] | None = None  # only built when an event is dropped
        size = len(sep)
        for event in block[:-size].split(sep):
            stop = offset + len(event) + size
            payload = event_data(event)
            if payload is None:  # a comment, or an event without data (passed through)
                offset = stop
                continue
            if payload == _DONE:
                self.done = True
                self._tail = b""
                return _joined(pieces, block, kept_from, stop)
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict):
                self.malformed = event[:200]
                self._tail = b""
                return _joined(pieces, block, kept_from, offset)
            self.events += 1
            if obj.get("error") is not None or obj.get("object") == "error":
                err = obj.get("error")
                self.error = err if isinstance(err, dict) else obj
            usage = obj.get("usage") if self._usage_of is None else self._usage_of(obj)
            if isinstance(usage, dict):
                self.usage = usage
                if self._strip_usage and not obj.get("choices"):
                    pieces = pieces if pieces is not None else []
                    pieces.append(block[kept_from:offset])
                    kept_from = stop
            offset = stop
        return _joined(pieces, block, kept_from, len(block))

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event (a cut-off event)."""
        return self._tail


def _joined(pieces: list[bytes] | None, block: bytes, start: int, stop: int) -> bytes:
    if pieces is None:
        return block[:stop] if start == 0 else block[start:stop]
    pieces.append(block[start:stop])
    return b"".join(pieces)


def complete_events(tail: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The complete events in ``tail + chunk`` (line ends normalized), and the bytes after the
    last of them: for a translator that reads another dialect's events whole."""
    data = (tail + chunk).replace(b"\r\n", b"\n")
    end = data.rfind(b"\n\n")
    if end < 0:
        return [], data
    return [event for event in data[:end].split(b"\n\n") if event], data[end + 2 :]


def event_data(event: bytes) -> bytes | None:
    """An event's data (several ``data:`` lines joined by newlines), ``None`` when it has
    none (an SSE comment such as ``: keep-alive``, or only ``event:``/``id:`` fields)."""
    if event.startswith(b"data:") and b"\n" not in event:
        # OpenAI-style streams: one data line per event (the fast path).
        return event[5:].strip(b" \r")
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(lines)


def closing_events(
    chunk_id: str, created: int, model: str | None, usage: dict[str, Any] | None, *, strip_usage: bool
) -> list[bytes]:
    """The end of a chat-completions stream translated from another dialect: the usage chunk
    (unless the client did not ask for usage) and ``data: [DONE]``."""
    out = []
    if not strip_usage:
        usage_chunk = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        out.append(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out
