"""An attempt's waits on one timer: each wait has its own bound (first byte, then each read
by ``idle_s``), never past the total deadline; time between waits does not count; a cancel
from elsewhere is not a timeout; the timer is armed once however many waits. On virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.dispatch.idle import AttemptWatch
from tests.unit.dispatch.virtual_time import run


async def _read(watch: AttemptWatch, bound_s: float | None, wait_s: float) -> str:
    """One bounded wait of ``bound_s`` that takes ``wait_s``: 'data', 'timeout' or 'total'."""
    watch.within(bound_s)
    try:
        await asyncio.sleep(wait_s)
    except asyncio.CancelledError:
        if watch.expired():
            return "total" if watch.at_total() else "timeout"
        raise
    watch.idle()
    return "data"


def test_each_read_has_its_own_idle_bound() -> None:
    async def go() -> list[str]:
        watch = AttemptWatch(None)
        try:
            # 4 s, 4 s, 4 s: each read inside its 5 s although together they take 12 s.
            return [await _read(watch, 5.0, 4.0) for _ in range(3)] + [await _read(watch, 5.0, 6.0)]
        finally:
            watch.stop()

    assert run(go()) == ["data", "data", "data", "timeout"]


def test_time_between_reads_does_not_count() -> None:
    async def go() -> list[str]:
        watch = AttemptWatch(None)
        try:
            first = await _read(watch, 5.0, 1.0)
            await asyncio.sleep(20.0)  # writing to a slow client
            return [first, await _read(watch, 5.0, 4.0)]
        finally:
            watch.stop()

    assert run(go()) == ["data", "data"]


def test_the_total_deadline_cuts_a_read_short_and_says_so() -> None:
    async def go() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        watch = AttemptWatch(start + 3.0)
        try:
            return await _read(watch, 5.0, 4.0), loop.time() - start
        finally:
            watch.stop()

    outcome, took_s = run(go())
    assert outcome == "total" and took_s == pytest.approx(3.0)


def test_a_read_bound_earlier_than_the_first_waits_is_kept() -> None:
    """The first byte may take 10 s, each read after it only 2 s: a read whose bound falls
    before the timer armed for the first wait re-arms it (the long bound does not leak)."""

    async def go() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        watch = AttemptWatch(None)
        try:
            outcomes = [await _read(watch, 10.0, 1.0), await _read(watch, 2.0, 1.5)]
            outcomes.append(await _read(watch, 2.0, 30.0))
            return outcomes, loop.time() - start
        finally:
            watch.stop()

    outcomes, took_s = run(go())
    assert outcomes == ["data", "data", "timeout"]
    assert took_s == pytest.approx(1.0 + 1.5 + 2.0)


def test_one_timer_for_a_stream_of_reads() -> None:
    """A first token and many quick reads arm the loop's timer once, not once per read."""

    async def go() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            nonlocal armed
            if isinstance(getattr(callback, "__self__", None), AttemptWatch):
                armed += 1
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        watch = AttemptWatch(loop.time() + 600.0)
        try:
            assert await _read(watch, 60.0, 0.01) == "data"
            for _ in range(100):
                assert await _read(watch, 60.0, 0.01) == "data"
        finally:
            watch.stop()
        return armed

    assert run(go()) == 1


def test_no_bound_no_timer() -> None:
    async def go() -> str:
        watch = AttemptWatch(None)
        outcome = await _read(watch, None, 1000.0)
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
        watch = AttemptWatch(None)
        try:
            return await _read(watch, 5.0, 4.0)
        finally:
            watch.stop()

    assert run(go())


def test_reads_go_on_in_the_task_that_rebinds() -> None:
    """A stream opened in a hedged attempt's task is read by the request's task: the bound
    cancels the reader, not the finished opener."""

    async def go() -> str:
        opener = asyncio.ensure_future(_open())
        watch = await opener
        watch.rebind()
        try:
            return await _read(watch, 5.0, 6.0)
        finally:
            watch.stop()

    async def _open() -> AttemptWatch:
        watch = AttemptWatch(None)
        await _read(watch, 5.0, 1.0)
        return watch

    assert run(go()) == "timeout"
