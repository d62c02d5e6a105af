"""Run a coroutine on an event loop whose clock jumps instead of waiting.

Whenever the loop would block for a timer, virtual time advances to that timer at once,
so ``asyncio.sleep``, ``asyncio.timeout`` and ``asyncio.wait(timeout=...)`` all run on
virtual time and a test of retries, hedging and circuits takes milliseconds. There is no
real I/O on this loop (the upstream is a MockTransport).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("deadlock: nothing scheduled and nothing to wait for")
        self._loop.virtual_s += max(0.0, timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual seconds (starting at 1000)."""

    def __init__(self) -> None:
        self.virtual_s = 1000.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.virtual_s


class LoopClock:
    """The dispatch clock on the running loop's (virtual) time."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
