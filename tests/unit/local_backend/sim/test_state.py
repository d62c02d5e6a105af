"""The max_num_seqs queue and the seeded jitter."""

from __future__ import annotations

import asyncio
import statistics

from local_backend.sim import Admission, SimConfig, SimState


def test_admission_is_fifo_and_counts_running_and_waiting() -> None:
    async def main() -> list[int]:
        gate = Admission(limit=2)
        order: list[int] = []

        async def job(i: int) -> None:
            await gate.acquire()
            order.append(i)
            await asyncio.sleep(0.01)
            gate.release()

        tasks = [asyncio.create_task(job(i)) for i in range(5)]
        await asyncio.sleep(0)
        assert (gate.running, gate.waiting) == (2, 3)
        await asyncio.gather(*tasks)
        assert (gate.running, gate.waiting) == (0, 0)
        return order

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_a_cancelled_waiter_leaves_the_queue_and_a_cancelled_winner_passes_its_slot_on() -> None:
    async def main() -> None:
        gate = Admission(limit=1)
        await gate.acquire()
        leaver = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0)
        assert gate.waiting == 1
        leaver.cancel()
        await asyncio.sleep(0)
        assert (gate.running, gate.waiting) == (1, 0)
        # A waiter cancelled in the same turn it is handed the slot gives the slot on.
        winner = asyncio.create_task(gate.acquire())
        third = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0)
        gate.release()
        winner.cancel()
        await asyncio.sleep(0)
        await third
        assert (gate.running, gate.waiting) == (1, 0)
        gate.release()
        assert gate.running == 0

    asyncio.run(main())


def test_jitter_is_seeded_non_negative_and_has_the_asked_spread() -> None:
    a, b = SimState(SimConfig(seed=3)), SimState(SimConfig(seed=3))
    xs = [a.jittered_s(20, 5) for _ in range(2000)]
    assert xs == [b.jittered_s(20, 5) for _ in range(2000)]
    assert min(xs) >= 0
    assert abs(statistics.mean(xs) - 0.020) < 0.001 and abs(statistics.stdev(xs) - 0.005) < 0.0005
    assert a.jittered_s(20, 0) == 0.020
    a.reset()  # re-seeds: the sequence starts over
    assert a.jittered_s(20, 5) == xs[0]
