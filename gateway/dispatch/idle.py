"""The idle bound of a stream: one timer for the whole stream instead of one per chunk.

``asyncio.timeout_at`` around every read arms and cancels a timer per chunk (~5 µs each
here, a token stream's hundreds of reads); :class:`IdleWatch` keeps one timer that, when it
fires, looks at when the read in progress began and either re-arms for that read's own
deadline or cancels the waiting task. A read's bound is the same as before: it may last
``idle_s`` (and never past the request's total deadline), and time the stream spends
outside a read (writing to a slow client) does not count.
"""

from __future__ import annotations

import asyncio


class IdleWatch:
    """Bounds each :meth:`reading` span of the current task by ``idle_s`` seconds and by
    ``total_deadline`` (loop time). Use as::

        watch = IdleWatch(idle_s, total_deadline)
        try:
            while ...:
                watch.reading()
                try:
                    chunk = await anext(chunks)
                except asyncio.CancelledError:
                    if watch.expired():
                        raise TimeoutError from None
                    raise
                watch.idle()
        finally:
            watch.stop()
    """

    __slots__ = ("_cancelling", "_deadline", "_expired", "_handle", "_idle_s", "_loop", "_task", "_total")

    def __init__(self, idle_s: float | None, total_deadline: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "IdleWatch runs inside a task"
        self._task = task
        self._idle_s = idle_s or None
        self._total = total_deadline
        self._deadline: float | None = None  # of the read in progress; None between reads
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False
        self._cancelling = 0

    def reading(self) -> None:
        """A read begins now: it must end within ``idle_s`` and by the total deadline."""
        idle_s, total = self._idle_s, self._total
        if idle_s is not None:
            deadline = self._loop.time() + idle_s
            if total is not None and total < deadline:
                deadline = total
        elif total is not None:
            deadline = total
        else:
            return
        self._deadline = deadline
        self._cancelling = self._task.cancelling()
        # An armed timer due no later than this read's deadline is kept: when it fires it
        # re-arms for the deadline of the read then in progress (the usual case: one timer).
        if self._handle is None:
            self._handle = self._loop.call_at(deadline, self._fire)

    def idle(self) -> None:
        """The read ended (with data or not): the time until the next read is not bounded."""
        self._deadline = None

    def expired(self) -> bool:
        """Called on ``CancelledError`` from a read: whether it was this watch's doing (and
        no one else's cancel), so the read timed out."""
        return self._expired and self._task.uncancel() <= self._cancelling

    def stop(self) -> None:
        """No more reads: drop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            # Between reads (the stream is writing to its client): the next read arms again.
            return
        if self._loop.time() < deadline:
            self._handle = self._loop.call_at(deadline, self._fire)
            return
        self._expired = True
        self._task.cancel()
