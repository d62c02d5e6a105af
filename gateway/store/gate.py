"""The bound on every Redis call a request waits for (the key check, the rate-limit check).

A request must never wait long for Redis: a healthy one answers in well under a
millisecond, a frozen one (a stopped process, a partitioned network) never does. Each
call through a :class:`RedisGate` is bounded by ``timeout_s``; after a failure the gate
counts Redis as unreachable for ``retry_s`` and the callers that have a fail-open path
take it at once without asking Redis (a key verified before keeps working, the rate
limit admits). The first call after ``retry_s`` probes Redis again, so a frozen Redis
costs one request a second ``timeout_s``, not every request (and not a request twice:
its key check finds Redis frozen, its rate-limit check then does not wait again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from redis.exceptions import RedisError

_log = structlog.get_logger("switchyard.redis")

T = TypeVar("T")

REDIS_FAULTS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
"""What a Redis call raises when Redis is down, slow or unreachable."""


class RedisGate:
    """Bounds request-path Redis calls and remembers, for a moment, that Redis is failing."""

    def __init__(
        self,
        timeout_s: float = 0.05,
        *,
        open_after: int = 1,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._open_after = open_after
        self._retry_s = retry_s
        self._clock = clock
        self._failures = 0
        self._closed_until = 0.0
        self.failed_calls = 0
        """Calls that timed out or failed, since start."""
        self.skipped_calls = 0
        """Calls not made because Redis was counted unreachable, since start."""

    @property
    def unreachable(self) -> bool:
        """Whether callers should skip Redis now (and count the skip with :meth:`skip`)."""
        return self._clock() < self._closed_until

    def skip(self) -> None:
        """Count a call its caller did not make because Redis is unreachable."""
        self.skipped_calls += 1

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """``await make()`` within ``timeout_s`` (:class:`TimeoutError` past it); a failure
        (one of :data:`REDIS_FAULTS`) is counted and raised again."""
        try:
            result = await _bounded(make(), self.timeout_s)
        except REDIS_FAULTS as exc:
            self.failed(exc)
            raise
        if self._failures:
            self.answered()
        return result

    def answered(self) -> None:
        """Count an answer from Redis made without :meth:`call` (it bounded its own wait)."""
        if self._failures:
            if self._failures >= self._open_after:
                _log.warning("redis_reachable_again", failed_calls=self.failed_calls)
            self._failures = 0
            self._closed_until = 0.0

    def failed(self, exc: BaseException) -> None:
        """Count a call that failed with ``exc`` (made through :meth:`call`, or by a client
        that bounds its own wait by :attr:`timeout_s`)."""
        self.failed_calls += 1
        self._failures += 1
        if self._failures >= self._open_after:
            if self._failures == self._open_after:
                # One line when Redis stops answering, one when it answers again.
                _log.warning(
                    "redis_unreachable",
                    error=type(exc).__name__,
                    timeout_ms=round(self.timeout_s * 1000, 1),
                    retry_s=self._retry_s,
                )
            self._closed_until = self._clock() + self._retry_s


async def _bounded(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable``, cancelled with :class:`TimeoutError` once ``timeout_s`` has passed.

    Unlike :func:`asyncio.timeout`, the cancel waits two more turns of the event loop after
    the deadline: on a busy loop, Redis's answer is often already read in the very turn the
    deadline fires, and the bound is for Redis's slowness, not for this process's own.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    expired = False
    handles: list[asyncio.Handle] = []

    def cancel(turns_left: int) -> None:
        nonlocal expired
        if turns_left:
            handles.append(loop.call_soon(cancel, turns_left - 1))
            return
        expired = True
        task.cancel()

    handles.append(loop.call_later(timeout_s, cancel, 2))
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expired and task.uncancel() == 0:
            raise TimeoutError(f"Redis did not answer within {timeout_s * 1000:g} ms") from None
        raise
    finally:
        handles[-1].cancel()
