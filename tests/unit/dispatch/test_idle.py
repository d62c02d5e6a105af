"""The stream's idle bound (one timer per stream): a read may last ``idle_s``, never past
the total deadline; time between reads does not count; a cancel from elsewhere is not a
timeout. On virtual time."""

from __future__ import annotations

import asyncio

import pytest

from gateway.dispatch.idle import IdleWatch
from tests.unit.dispatch.virtual_time import run


async def _read(watch: IdleWatch, wait_s: float) -> str:
    """One bounded read that takes ``wait_s``: 'data' or 'timeout'."""
    watch.reading()
    try:
        await asyncio.sleep(wait_s)
    except asyncio.CancelledError:
        if watch.expired():
            return "timeout"
        raise
    watch.idle()
    return "data"


def test_each_read_has_its_own_idle_bound() -> None:
    async def go() -> list[str]:
        watch = IdleWatch(5.0, None)
        try:
            # 4 s, 4 s, 4 s: each read inside its 5 s although together they take 12 s.
            return [await _read(watch, 4.0) for _ in range(3)] + [await _read(watch, 6.0)]
        finally:
            watch.stop()

    assert run(go()) == ["data", "data", "data", "timeout"]


def test_time_between_reads_does_not_count() -> None:
    async def go() -> list[str]:
        watch = IdleWatch(5.0, None)
        try:
            first = await _read(watch, 1.0)
            await asyncio.sleep(20.0)  # writing to a slow client
            return [first, await _read(watch, 4.0)]
        finally:
            watch.stop()

    assert run(go()) == ["data", "data"]


def test_the_total_deadline_cuts_a_read_short() -> None:
    async def go() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        watch = IdleWatch(5.0, start + 3.0)
        try:
            return await _read(watch, 4.0), loop.time() - start
        finally:
            watch.stop()

    outcome, took_s = run(go())
    assert outcome == "timeout" and took_s == pytest.approx(3.0)


def test_no_bound_no_timer() -> None:
    async def go() -> str:
        watch = IdleWatch(None, None)
        outcome = await _read(watch, 1000.0)
        assert watch._handle is None
        return outcome

    assert run(go()) == "data"


def test_a_cancel_from_elsewhere_is_not_a_timeout() -> None:
    async def go() -> bool:
        reader = asyncio.ensure_future(_read_in_own_task())
        await asyncio.sleep(1.0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        return True

    async def _read_in_own_task() -> str:
        watch = IdleWatch(5.0, None)
        try:
            return await _read(watch, 4.0)
        finally:
            watch.stop()

    assert run(go())
