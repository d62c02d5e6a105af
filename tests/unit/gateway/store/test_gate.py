"""The request-path bound on Redis: each call within its timeout, and a Redis that keeps
failing skipped for a moment instead of waited for by every request."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.store.gate import RedisGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _hang() -> None:
    await asyncio.sleep(3600)


async def _ok() -> str:
    return "ok"


async def _refused() -> None:
    raise RedisConnectionError("refused")


def test_a_call_past_its_timeout_is_a_timeout_error_within_the_bound() -> None:
    gate = RedisGate(0.02)

    async def run() -> float:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            await gate.call(_hang)
        return time.perf_counter() - t0

    assert asyncio.run(run()) < 0.5
    assert gate.failed_calls == 1 and gate.unreachable


def test_an_answer_read_in_the_turn_the_deadline_fires_still_counts() -> None:
    """A busy loop reads Redis's answer late: the bound is for Redis, not for the loop."""
    gate = RedisGate(0.01)

    async def run() -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()

        async def reply() -> str:
            return await answer

        # The answer arrives just before the deadline, but the loop is blocked past it.
        loop.call_later(0.009, answer.set_result, "late but there")
        loop.call_later(0.001, time.sleep, 0.05)
        return await gate.call(reply)

    assert asyncio.run(run()) == "late but there"


def test_failures_in_a_row_mark_redis_unreachable_for_retry_s_then_one_success_clears_it() -> None:
    """(With ``open_after`` 3; the default is 1.)"""
    clock = Clock()
    gate = RedisGate(0.05, open_after=3, retry_s=1.0, clock=clock)

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(RedisConnectionError):
                await gate.call(_refused)
        assert not gate.unreachable  # two failures might be a blip
        assert await gate.call(_ok) == "ok"
        for _ in range(3):
            with pytest.raises(RedisConnectionError):
                await gate.call(_refused)
        assert gate.unreachable
        clock.now += 1.01
        assert not gate.unreachable  # time for one probe
        with pytest.raises(RedisConnectionError):
            await gate.call(_refused)
        assert gate.unreachable  # the probe failed: skipped again at once
        clock.now += 1.01
        assert await gate.call(_ok) == "ok"
        assert not gate.unreachable

    asyncio.run(run())
    assert gate.failed_calls == 6


def test_a_caller_cancelled_from_outside_is_not_a_timeout() -> None:
    gate = RedisGate(10.0)

    async def run() -> None:
        task = asyncio.create_task(gate.call(_hang))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
