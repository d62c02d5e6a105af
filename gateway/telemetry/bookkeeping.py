"""A finished request's bookkeeping as data: the record appended to a buffer, and every
batch sink (the log line, the Prometheus tallies, the dashboard counters, the cache stats)
fed the whole buffer by one task every :data:`INTERVAL_S`.

Fed one record at a time, each sink ran its code cold between two requests' aiohttp work;
fed a batch, each runs its loop over many records with its lookups hoisted and its code
warm. Nothing is lost and nothing a user reads is stale: the buffer is folded before a
``/metrics`` scrape, before every ``/admin`` report read from Redis, at the metrics sync
(so a worker killed outright loses at most what the sync's documented bound says), and at
shutdown; a buffer of :data:`MAX_BATCH` records is folded at once, so memory stays bounded
whatever the event loop's lag.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from gateway.telemetry.record import FinishedRequest

_log = structlog.get_logger("switchyard.telemetry")

BatchSink = Callable[[Sequence[FinishedRequest]], None]
"""Takes the records of a batch, oldest first."""

INTERVAL_S = 0.05
"""How often the buffer is folded: the request log line is at most this late."""
MAX_BATCH = 512
"""A buffer this long is folded at once (bounded memory and a bounded pause)."""


class Bookkeeping:
    """The buffer of finished requests' records and the batch sinks that fold it."""

    def __init__(self, sinks: Sequence[BatchSink], interval_s: float = INTERVAL_S) -> None:
        self._sinks = tuple(sinks)
        self._interval_s = interval_s
        self._records: list[FinishedRequest] = []
        self._direct = False
        self.failures = 0
        """Sink calls that raised (logged at most every 10 s; the other sinks still ran)."""
        self._last_warning = 0.0

    def add(self, done: FinishedRequest) -> None:
        """A request sink: buffer ``done`` (folded now when the task has stopped, or the
        buffer is full)."""
        records = self._records
        records.append(done)
        if self._direct or len(records) >= MAX_BATCH:
            self.flush()

    @property
    def pending(self) -> int:
        """Records waiting for the next fold."""
        return len(self._records)

    def flush(self) -> None:
        """Fold every buffered record into every batch sink, now."""
        records = self._records
        if not records:
            return
        self._records = []
        for sink in self._sinks:
            try:
                sink(records)
            except Exception as exc:  # one broken sink must not cost the others their records
                self._failed(sink, exc)

    def _failed(self, sink: BatchSink, exc: Exception) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_warning > 10:
            self._last_warning = now
            name = getattr(sink, "__qualname__", repr(sink))
            _log.error("bookkeeping_sink_failed", sink=name, error=repr(exc), failures=self.failures)

    async def run(self) -> None:
        """Fold every ``interval_s`` until cancelled; on the way out fold what is left and
        fold each later record as it comes (a request that ends after the stop)."""
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                self.flush()
        finally:
            self._direct = True
            self.flush()
