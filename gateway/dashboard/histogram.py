"""Log-spaced latency histograms: a latency is counted in one 10 %-wide bucket, and a
percentile is read back as its bucket's geometric middle (within ±5 % of the exact one)."""

from __future__ import annotations

import math

LATENCIES = ("ttft", "itl", "e2e")
BASE_MS = 0.1
GROWTH = 1.1
_LOG_GROWTH = math.log(GROWTH)


def bucket_of(ms: float) -> int:
    """The histogram bucket of a latency: bucket ``i`` holds (0.1 ms * 1.1^(i-1), 0.1 ms * 1.1^i]."""
    if ms <= BASE_MS:
        return 0
    return math.ceil(math.log(ms / BASE_MS) / _LOG_GROWTH)


def bucket_value_ms(index: int) -> float:
    """The figure a bucket reports: the geometric middle of its bounds."""
    if index <= 0:
        return BASE_MS
    return BASE_MS * float(GROWTH ** (index - 0.5))


def percentile_ms(buckets: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a bucketed distribution, or None when it is empty."""
    total = sum(buckets.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= rank:
            return round(bucket_value_ms(index), 3)
    return None  # pragma: no cover - seen reaches total
