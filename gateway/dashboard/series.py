"""The dashboard's time series: the window's 1-minute buckets folded into at most
``MAX_POINTS`` points, so a 24-hour window draws as quickly as a 5-minute one.

Each point sums its minutes' counters (requests, errors, cost, tiers) and merges their
latency histograms, so a point's p50/p95 are true percentiles of its requests, not an
average of per-minute percentiles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from gateway.dashboard.histogram import LATENCIES, percentile_ms

MAX_POINTS = 120
NO_DEPLOYMENT = "(none)"
"""What the dashboard names the deployment of a request that never reached one (counted
in the totals, not drawn as a deployment's line)."""
_NANO = 1e9


def minutes_per_point(window_minutes: int) -> int:
    """How many 1-minute buckets one point covers (1 up to a two-hour window)."""
    return max(1, math.ceil(window_minutes / MAX_POINTS))


class SeriesBuilder:
    """Collects a window's per-minute dashboard counters into points; ``result()`` is the
    ``series`` object of ``GET /admin/dashboard``."""

    def __init__(self, minutes: range, bucket_s: int) -> None:
        self._first = minutes.start
        self._step = minutes_per_point(len(minutes))
        self._points = math.ceil(len(minutes) / self._step)
        self._bucket_s = bucket_s
        self._requests = [0] * self._points
        self._errors = [0] * self._points
        self._cost_nusd = [0] * self._points
        self._tiers: dict[str, list[int]] = defaultdict(lambda: [0] * self._points)
        self._dep_requests: dict[str, list[int]] = defaultdict(lambda: [0] * self._points)
        # deployment -> latency -> per point: bucket index -> count
        self._hist: dict[str, dict[str, list[dict[int, int]]]] = defaultdict(
            lambda: {name: [defaultdict(int) for _ in range(self._points)] for name in LATENCIES}
        )
        cache_fields = (
            "prompt_tokens",
            "cached_tokens",
            "expected_cached_tokens",
            "rc_hits",
            "rc_misses",
            "rc_stores",
            "rc_saved_nano_usd",
        )
        self._cache = [dict.fromkeys(cache_fields, 0) for _ in range(self._points)]

    def point_of(self, minute: int) -> int:
        """The point a Unix minute of the window falls in."""
        return (minute - self._first) // self._step

    def add(self, point: int, deployment: str, metric: str, value: int) -> None:
        """One field of a ``sy:dash:<minute>`` hash (``metric`` as stored after the key)."""
        if metric.startswith("h:"):
            _, latency, index = metric.split(":")
            self._hist[deployment][latency][point][int(index)] += value
        elif metric.startswith("tier:"):
            self._tiers[metric[5:]][point] += value
        elif metric == "requests":
            self._requests[point] += value
            if deployment != NO_DEPLOYMENT:
                self._dep_requests[deployment][point] += value
        elif metric == "errors":
            self._errors[point] += value
        elif metric == "cost_nusd":
            self._cost_nusd[point] += value

    def add_cache(self, point: int, totals: dict[str, int]) -> None:
        """One minute's cache-accounting totals (prompt, cached and expected cached tokens)."""
        point_totals = self._cache[point]
        for name in point_totals:
            point_totals[name] += totals.get(name, 0)

    def result(self) -> dict[str, Any]:
        """The series: ``t`` (each point's start, Unix seconds) and one list per figure,
        aligned with it; a rate or percentile without samples is ``null``."""

        def rate(part: int, whole: int) -> float | None:
            return round(part / whole, 4) if whole else None

        deployments: dict[str, Any] = {}
        for name in sorted(set(self._dep_requests) | set(self._hist)):
            hist = self._hist[name]
            deployments[name] = {
                "requests": self._dep_requests[name],
                **{
                    f"{latency}_ms": {
                        "p50": [percentile_ms(h, 0.50) for h in hist[latency]],
                        "p95": [percentile_ms(h, 0.95) for h in hist[latency]],
                    }
                    for latency in LATENCIES
                },
            }
        return {
            "step_s": self._step * self._bucket_s,
            "t": [(self._first + p * self._step) * self._bucket_s for p in range(self._points)],
            "requests": self._requests,
            "errors": self._errors,
            "error_rate": [rate(e, r) for e, r in zip(self._errors, self._requests, strict=True)],
            "cost_usd": [round(n / _NANO, 6) for n in self._cost_nusd],
            "tiers": {tier: counts for tier, counts in sorted(self._tiers.items())},
            "deployments": deployments,
            "cache": {
                "prompt_tokens": [c["prompt_tokens"] for c in self._cache],
                "hit_rate": [rate(c["cached_tokens"], c["prompt_tokens"]) for c in self._cache],
                "expected_hit_rate": [
                    rate(c["expected_cached_tokens"], c["prompt_tokens"]) for c in self._cache
                ],
            },
            "response_cache": {
                "hit_rate": [
                    rate(c["rc_hits"], c["rc_hits"] + c["rc_misses"] + c["rc_stores"]) for c in self._cache
                ],
                "saved_usd": [round(c["rc_saved_nano_usd"] / _NANO, 6) for c in self._cache],
            },
        }
