"""The time dispatch reads and waits on, injectable so tests run on virtual time.

Backoff, Retry-After cooling, circuit cooldowns, budgets and latency windows read a
:class:`Clock`. Attempt timeouts and hedge delays are ``asyncio`` timers on the event
loop's own clock; the dispatcher's unit tests run the loop on virtual time
(``tests/unit/dispatch/virtual_time.py``) with a clock that reads the loop's time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds, and a way to wait for some."""

    def now(self) -> float:
        """Seconds on a monotonic clock (only differences mean anything)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""


class SystemClock:
    """The real clock: ``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told (:meth:`advance`), or by exactly what is slept."""

    __slots__ = ("_now",)

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


SYSTEM_CLOCK = SystemClock()
