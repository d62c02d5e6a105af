"""structlog JSON lines, written by a background thread so the event loop never blocks on stdout.

The queue between the two is bounded: when the output cannot keep up, lines are
dropped and counted rather than stalling requests or growing memory.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from typing import IO, Any

import orjson
import structlog


class _QueuedBytesWriter:
    """A file-like object for structlog's BytesLogger that hands lines to a writer thread."""

    def __init__(self, out: IO[bytes], max_lines: int = 10_000) -> None:
        self._out = out
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=max_lines)
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name="switchyard-log", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            self.dropped += 1

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
        self._queue.put(None)
        self._thread.join(timeout_s)


_writer: _QueuedBytesWriter | None = None


def configure(level: str = "info", fmt: str = "json", out: IO[bytes] | None = None) -> None:
    """Set up structlog for the process: JSON lines (default) or a readable console format."""
    global _writer
    numeric = logging.getLevelName(level.upper())
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


def dropped_lines() -> int:
    return _writer.dropped if _writer is not None else 0


def shutdown() -> None:
    """Flush queued lines (at exit)."""
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None
