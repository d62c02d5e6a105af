"""What a deployment's circuit costs the event loop when its window is full, in process.

    python bench/probes/circuit_cost.py [--rate 2000] [--window 30]

The circuit keeps every attempt of its window (``dispatch.circuit.window_s``, 30 s by
default): at ``--rate`` attempts a second that is rate x window outcomes. Times, on a full
window, best of 5: ``Breakers.status()`` (the metrics sync calls it four times a second;
``/readyz`` and the admin API on each call) and ``record()`` of a failed attempt while
every attempt fails (an outage, before the circuit opens). Run it with ``PYTHONPATH`` set
to the tree to measure.
"""

from __future__ import annotations

import argparse
import time

from gateway.dispatch.circuit import Breakers
from gateway.dispatch.clock import ManualClock
from gateway.dispatch.policy import CircuitPolicy


def _filled(rate: int, window_s: float, ok: bool) -> tuple[Breakers, ManualClock]:
    clock = ManualClock()
    breakers = Breakers(clock)
    # The circuit never opens here: the rate's cost is what is measured, not the opening.
    never = 10**9
    breakers.configure(
        CircuitPolicy(shared=False, window_s=window_s, consecutive_failures=never, min_requests=never)
    )
    for _ in range(int(rate * window_s)):
        clock.advance(1.0 / rate)
        breakers.record("d", ok)
    return breakers, clock


def _best_us(fn: object, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    healthy, _ = _filled(args.rate, args.window, True)
    failing, clock = _filled(args.rate, args.window, False)

    def fail() -> None:
        clock.advance(1.0 / args.rate)
        failing.record("d", False)

    print(f"{args.rate} attempts/s, {args.window:g} s window ({int(args.rate * args.window):,} outcomes)")
    print(f"  status()                  {_best_us(healthy.status, 20):10.1f} us")
    print(f"  record() of a failure     {_best_us(fail, 200):10.1f} us")


if __name__ == "__main__":
    main()
