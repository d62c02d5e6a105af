"""The bounds of an attempt's waits: one timer for the whole attempt instead of one per stage.

An attempt waits in stages: the connection and the first byte (or first token), then each
read of the body or stream. ``asyncio.timeout_at`` around each stage arms and cancels a timer
and builds a context (~4 µs each here, a token stream's hundreds of reads); an
:class:`AttemptWatch` keeps one timer that, when it fires, looks at the wait in progress
and either re-arms for that wait's own deadline or cancels the waiting task. A wait's bound
is the same as with nested timeouts: its own (``first_byte_s``, ``idle_s`` ...) and never
past the request's total deadline; time spent outside a wait (writing to a slow client)
does not count.
"""

from __future__ import annotations

import asyncio


class AttemptWatch:
    """Bounds each wait of the current task (:meth:`until` ... :meth:`idle`) by its own
    deadline and by ``total_deadline`` (loop time). Use as::

        watch = AttemptWatch(total_deadline)
        try:
            watch.within(first_byte_s)
            try:
                first = await ...
            except asyncio.CancelledError:
                if watch.expired():
                    raise (total_timeout if watch.at_total() else first_byte_timeout) from None
                raise
            watch.idle()
        finally:
            watch.stop()
    """

    __slots__ = (
        "_cancelling",
        "_deadline",
        "_due",
        "_expired",
        "_handle",
        "_loop",
        "_task",
        "_total",
    )

    def __init__(self, total_deadline: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "AttemptWatch runs inside a task"
        self._task = task
        self._total = total_deadline
        self._deadline: float | None = None  # of the wait in progress; None between waits
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the armed timer fires
        self._expired: float | None = None  # the deadline that expired
        self._cancelling = 0

    def within(self, seconds: float | None) -> None:
        """A wait begins now: it must end within ``seconds`` (``None`` or 0: no bound of its
        own) and by the total deadline."""
        self.until(self._loop.time() + seconds if seconds else None)

    def until(self, deadline: float | None) -> None:
        """A wait begins now: it must end by ``deadline`` (loop time; ``None``: no bound of its
        own) and by the total deadline."""
        total = self._total
        if deadline is None or (total is not None and total < deadline):
            deadline = total
        if deadline is None:
            self._deadline = None
            return
        self._deadline = deadline
        self._cancelling = self._task.cancelling()
        handle = self._handle
        # An armed timer due no later than this wait's deadline is kept: when it fires it
        # re-arms for the deadline of the wait then in progress (the usual case: one timer).
        if handle is None:
            self._handle = self._loop.call_at(deadline, self._fire)
            self._due = deadline
        elif self._due > deadline:
            handle.cancel()
            self._handle = self._loop.call_at(deadline, self._fire)
            self._due = deadline

    def idle(self) -> None:
        """The wait ended (with data or not): the time until the next one is not bounded."""
        self._deadline = None

    def rebind(self) -> None:
        """The waits go on in the current task (a stream opened by a hedged attempt's task
        is read by the request's)."""
        task = asyncio.current_task()
        assert task is not None, "AttemptWatch runs inside a task"
        self._task = task

    def expired(self) -> bool:
        """Called on ``CancelledError`` from a wait: whether it was this watch's doing (and
        no one else's cancel), so the wait timed out."""
        return self._expired is not None and self._task.uncancel() <= self._cancelling

    def at_total(self) -> bool:
        """Whether the deadline that expired was the request's total one."""
        return self._expired is not None and self._expired == self._total

    def stop(self) -> None:
        """No more waits: drop the timer."""
        self._deadline = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            # Between waits (the stream is writing to its client): the next wait arms again.
            return
        if self._loop.time() < deadline:
            self._handle = self._loop.call_at(deadline, self._fire)
            self._due = deadline
            return
        self._expired = deadline
        self._deadline = None
        self._task.cancel()
