"""Hedging without a task per request: the first attempt runs in the request's own task,
and a timer starts a twin (in a task of its own) only when that attempt is slow.

Racing two attempts with ``asyncio.wait`` needs both in tasks: a task, a wait and a gather
for every hedged request, fast or slow (~45 µs here). A :class:`HedgeRace` arms one timer
instead; a request that delivers within the hedge delay pays for that timer alone. When a
twin delivers first, its done callback cancels the request's task, and the first attempt's
``CancelledError`` is read as "a twin won" (:meth:`HedgeRace.twin_won`) unless something
else (a client that left) cancelled it too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

from gateway.dispatch.attempt import OpenStream

T = TypeVar("T")

StartTwin = Callable[[], "tuple[asyncio.Task[T], str] | None"]
"""Start a twin on the next candidate: its task and deployment, or None (no candidate left,
or the hedge budget is spent)."""


class HedgeRace(Generic[T]):
    """The twins of one hedged attempt, the timer that starts them, and which one won."""

    __slots__ = (
        "_cancelling",
        "_first_done",
        "_handle",
        "_start_twin",
        "_task",
        "delay",
        "extra",
        "max_extra",
        "taken",
        "twins",
        "winner",
    )

    def __init__(self, start_twin: StartTwin[T], max_extra: int, delay: float) -> None:
        self._start_twin = start_twin
        self.max_extra = max_extra
        self.delay = delay
        self.extra = 0
        self.twins: dict[asyncio.Task[T], str] = {}
        """Each twin's task and its deployment."""
        self.winner: asyncio.Task[T] | None = None
        """The twin that delivered while the first attempt still ran."""
        self.taken: asyncio.Task[T] | None = None
        self._first_done = False  # the first attempt ended: a twin's win cancels nothing
        task = asyncio.current_task()
        assert task is not None, "a hedged attempt runs inside a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        """The first attempt is slow: start a twin, and arm for the next if more are allowed."""
        self._handle = None
        if self.start_twin() is not None and self.extra < self.max_extra:
            self._handle = asyncio.get_running_loop().call_later(self.delay, self._fire)

    def start_twin(self) -> asyncio.Task[T] | None:
        """One more twin, when a candidate is left and the budget allows."""
        started = self._start_twin()
        if started is None:
            return None
        task, name = started
        self.extra += 1
        self.twins[task] = name
        task.add_done_callback(self._twin_done)
        return task

    def _twin_done(self, twin: asyncio.Task[T]) -> None:
        # exception() also marks a failed twin's error as seen (no "never retrieved" warning).
        if twin.cancelled() or twin.exception() is not None or self._first_done or self.winner is not None:
            return
        # The twin delivered first: the first attempt, in the request's task, is cancelled.
        self.winner = twin
        self._task.cancel()

    def twin_won(self) -> bool:
        """Called on ``CancelledError`` from the first attempt: whether a twin's win cancelled
        it (and nothing else did)."""
        return self.winner is not None and self._task.uncancel() <= self._cancelling

    def take(self, twin: asyncio.Task[T]) -> T:
        """``twin``'s answer is the request's."""
        self.taken = twin
        return twin.result()

    def stop_timer(self) -> None:
        """Start no more twins from the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    async def await_twins(self, last: BaseException) -> asyncio.Task[T]:
        """The first attempt failed while twins run: the first of them to deliver (more
        twins each delay, up to ``max_extra`` in all), else the last failure is raised."""
        self._first_done = True
        self.stop_timer()
        for twin in self.twins:
            if twin.done() and not twin.cancelled() and twin.exception() is None:
                return twin
        pending = {t for t in self.twins if not t.done()}
        while pending:
            can_hedge = self.extra < self.max_extra
            done, pending = await asyncio.wait(
                pending, timeout=self.delay if can_hedge else None, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                started = self.start_twin()
                if started is None:
                    self.extra = self.max_extra  # no twin to start: wait for what runs
                else:
                    pending.add(started)
                continue
            for fut in done:
                error = fut.exception()
                if error is None:
                    return fut
                last = error
        raise last

    async def end(self) -> None:
        """No more twins: those still running are cancelled, every answer not taken is closed."""
        self._first_done = True
        self.stop_timer()
        if not self.twins:
            return
        running = [t for t in self.twins if not t.done()]
        for twin in running:
            twin.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for twin in self.twins:
            if twin is not self.taken and not twin.cancelled() and twin.exception() is None:
                discard(twin.result())


def discard(result: object) -> None:
    """Close a losing attempt's stream (a non-stream answer needs nothing)."""
    if isinstance(result, OpenStream):
        with contextlib.suppress(Exception):
            result.close()
