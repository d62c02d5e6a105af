"""Sliding-window counters: the retry and hedge budgets, and recent latencies for hedging."""

from __future__ import annotations

import math
from collections import deque

from gateway.dispatch.clock import SYSTEM_CLOCK, Clock


class WindowCounter:
    """Counts events in 1-second buckets over the last ``window_s`` seconds."""

    __slots__ = ("_buckets", "_clock", "_window_s")

    def __init__(self, window_s: float = 10.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self._window_s = window_s
        self._clock = clock
        self._buckets: deque[list[float]] = deque()  # [second, count]

    def resize(self, window_s: float) -> None:
        self._window_s = window_s

    def add(self, n: float = 1.0, now: float | None = None) -> None:
        """Count ``n`` events now (``now``: the clock's time, when the caller has read it)."""
        second = math.floor(self._clock.now() if now is None else now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            # Older buckets were trimmed when this second's was opened.
            buckets[-1][1] += n
        else:
            buckets.append([second, n])
            self._trim(second)

    def total(self) -> float:
        self._trim(math.floor(self._clock.now()))
        return sum(count for _, count in self._buckets)

    def _trim(self, second: float) -> None:
        buckets = self._buckets
        while buckets and buckets[0][0] <= second - self._window_s:
            buckets.popleft()


class Budget:
    """Extra attempts (retries or hedges) allowed as a share of recent requests."""

    __slots__ = ("_extra", "_requests", "min_per_s", "ratio", "refused", "spent", "window_s")

    def __init__(
        self, ratio: float, min_per_s: float = 0.0, window_s: float = 10.0, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._requests = WindowCounter(window_s, clock)
        self._extra = WindowCounter(window_s, clock)
        self.spent = 0
        self.refused = 0

    def configure(self, ratio: float, min_per_s: float, window_s: float) -> None:
        self.ratio, self.min_per_s, self.window_s = ratio, min_per_s, window_s
        self._requests.resize(window_s)
        self._extra.resize(window_s)

    def note_request(self, now: float | None = None) -> None:
        """One more request the budget is a share of (``now``: the clock's time, if read)."""
        self._requests.add(1.0, now)

    def try_spend(self) -> bool:
        """Take one extra attempt from the budget; False (and counted) when it is used up."""
        allowed = max(self.min_per_s * self.window_s, self.ratio * self._requests.total())
        if self._extra.total() + 1 > allowed:
            self.refused += 1
            return False
        self._extra.add()
        self.spent += 1
        return True


class LatencyWindow:
    """The last ``size`` latencies of one deployment, with a cached p95."""

    __slots__ = ("_cached", "_cached_at", "_clock", "_samples")

    def __init__(self, size: int = 200, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._samples: deque[float] = deque(maxlen=size)
        self._cached: float | None = None
        self._cached_at = 0.0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)

    def p95(self, min_samples: int = 20) -> float | None:
        if len(self._samples) < min_samples:
            return None
        now = self._clock.now()
        if self._cached is None or now - self._cached_at > 1.0:
            ordered = sorted(self._samples)
            self._cached = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
            self._cached_at = now
        return self._cached
