"""Stopping a background task that drops a cancellation (as Python 3.11's wait_for can)."""

from __future__ import annotations

import asyncio

from gateway.http.serve import stop_task


def test_stop_task_ends_a_loop_that_swallowed_the_first_cancel() -> None:
    async def main() -> int:
        swallowed = 0

        async def stubborn_loop() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if swallowed == 0:
                        swallowed += 1  # what wait_for does when its write completed meanwhile
                        continue
                    raise

        task = asyncio.create_task(stubborn_loop())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(stop_task(task, wait_s=0.05), timeout=2.0)
        assert task.cancelled()
        return swallowed

    assert asyncio.run(main()) == 1


def test_stop_task_gives_up_on_a_task_that_never_stops() -> None:
    async def main() -> None:
        mortal = False

        async def immortal() -> None:
            while True:
                try:
                    await asyncio.sleep(1)
                except asyncio.CancelledError:
                    if mortal:
                        raise

        task = asyncio.create_task(immortal())
        await asyncio.sleep(0)
        await asyncio.wait_for(stop_task(task, wait_s=0.01), timeout=2.0)
        assert not task.done()
        mortal = True
        await stop_task(task, wait_s=0.01)
        assert task.cancelled()

    asyncio.run(main())
