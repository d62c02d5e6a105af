"""structlog JSON lines, written by a background thread so the event loop never blocks on stdout.

Lines logged on the event loop are gathered for a few milliseconds and handed to the
thread as one batch, so the thread wakes a few dozen times a second, not once a
request. The queue between the two is bounded: when the output cannot keep up, lines
are dropped and counted rather than stalling requests or growing memory.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import orjson
import structlog

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest


class _QueuedBytesWriter:
    """A file-like object for structlog's BytesLogger that hands lines to a writer thread."""

    BATCH_S = 0.02
    MAX_BATCH = 512

    def __init__(self, out: IO[bytes], max_batches: int = 1_000) -> None:
        self._out = out
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=max_batches)
        self._batch: list[bytes] = []
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="switchyard-log", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._put(data)
            return
        batch = self._batch
        batch.append(data)
        if len(batch) == 1:
            loop.call_later(self.BATCH_S, self._hand_off)
        elif len(batch) >= self.MAX_BATCH:
            self._hand_off()

    def write_lines(self, data: bytes, lines: int) -> None:
        """Hand ``lines`` whole lines to the thread at once, after the lines already batched."""
        self._hand_off()
        self._put(data, lines)

    def _hand_off(self) -> None:
        if self._batch:
            lines, self._batch = self._batch, []
            self._put(b"".join(lines), len(lines))

    def _put(self, data: bytes, lines: int = 1) -> None:
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            self.dropped += lines

    def flush(self) -> None:
        """Lines are flushed by the writer thread."""

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                return
            parts = [data]
            while len(parts) < 256:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                parts.append(more)
            try:
                self._out.write(b"".join(parts))
                self._out.flush()
            except (OSError, ValueError):
                return

    def close(self, timeout_s: float = 2.0) -> None:
        self._hand_off()
        self._queue.put(None)
        self._thread.join(timeout_s)


_writer: _QueuedBytesWriter | None = None
_json = False
_level = logging.INFO


def configure(level: str = "info", fmt: str = "json", out: IO[bytes] | None = None) -> None:
    """Set up structlog for the process: JSON lines (default) or a readable console format."""
    global _writer, _json, _level
    numeric = logging.getLevelName(level.upper())
    _json, _level = fmt == "json", numeric
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if fmt == "console":
        structlog.configure(
            processors=[*processors, structlog.dev.ConsoleRenderer(colors=False)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            cache_logger_on_first_use=True,
        )
        return
    if _writer is None:
        _writer = _QueuedBytesWriter(out or sys.stdout.buffer)
    structlog.configure(
        processors=[*processors, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.BytesLoggerFactory(_writer),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)


_request_logger = structlog.get_logger("switchyard.request")
_second = -1
_second_text = ""


def _timestamp(now: float | None = None) -> str:
    global _second, _second_text
    if now is None:
        now = time.time()
    whole = int(now)
    if whole != _second:
        _second, _second_text = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{_second_text}.{int((now - whole) * 1_000_000):06d}Z"


def request_line(**fields: Any) -> None:
    """The one line per request. In JSON mode it skips structlog's processor chain (the
    same shape, a fifth of the cost): it is written for every request."""
    if _writer is None or not _json:
        _request_logger.info("request", **fields)
        return
    if _level > logging.INFO:
        return
    fields["event"] = "request"
    fields["level"] = "info"
    fields["timestamp"] = _timestamp()
    _writer.write(orjson.dumps(fields) + b"\n")


def _fields(done: FinishedRequest) -> dict[str, Any]:
    """The request line's fields, in the line's order."""
    ttft = done.ttft_ms
    fields: dict[str, Any] = {
        "request_id": done.request_id,
        "key_id": done.key_id,
        "endpoint": done.endpoint,
        "model": done.requested_model,
        "tier": done.tier,
        "deployment": done.deployment,
        "stream": done.stream,
        "status": done.status,
        "error_code": done.error_code,
        "error_detail": done.error_detail,
        "attempts": done.attempts,
        "ttft_ms": round(ttft, 2) if ttft is not None else None,
        "total_ms": round(done.e2e_ms, 2),
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "cached_tokens": done.cached_tokens,
        "cost_usd": done.cost_nano_usd / 1e9 if done.cost_nano_usd else None,
    }
    if done.cache is not None:
        # Only where the response cache is on: the line keeps its shape everywhere else.
        fields["cache"] = done.cache
        if done.cache_entry is not None:
            fields["cache_entry"] = done.cache_entry
            fields["cache_saved_usd"] = done.cache_saved_nano_usd / 1e9
        if done.cache_similarity is not None:
            fields["cache_similarity"] = round(done.cache_similarity, 4)
    return fields


def log_request(done: FinishedRequest) -> None:
    """Write the request line of a finished request."""
    request_line(**_fields(done))


def log_requests(batch: Sequence[FinishedRequest]) -> None:
    """Write the request lines of a batch of finished requests (a batch sink,
    :mod:`gateway.telemetry.bookkeeping`): in JSON mode handed to the writer thread as one
    chunk, each line stamped with its request's end, not with the time of the batch."""
    writer = _writer
    if writer is None or not _json:
        for done in batch:
            log_request(done)
        return
    if _level > logging.INFO:
        return
    dumps = orjson.dumps
    lines = []
    for done in batch:
        fields = _fields(done)
        fields["event"] = "request"
        fields["level"] = "info"
        fields["timestamp"] = _timestamp(done.ended_at)
        lines.append(dumps(fields))
    lines.append(b"")
    writer.write_lines(b"\n".join(lines), len(batch))


def dropped_lines() -> int:
    return _writer.dropped if _writer is not None else 0


def shutdown() -> None:
    """Flush queued lines (at exit)."""
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None
