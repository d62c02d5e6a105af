"""bench/overhead.sh --cache: the report turns the cache modes' runs into issue 55's three
figures (a hit's added p50 at c=1, hits' req/s over misses', a miss's CPU over the cache
off) and says how many answers really were hits and stores."""

from __future__ import annotations

import json
from typing import Any

from bench import report


def run(
    target: str, mode: str, rps: float, p50: float, app_ticks: int, cache: dict[str, int]
) -> dict[str, Any]:
    requests = int(rps * 10)
    return {
        "target": target,
        "mode": mode,
        "concurrency": 1,
        "round": 1,
        "cpu_ticks": {"app": app_ticks, "redis": 10, "nginx": 5, "machine_busy": 1500, "machine_total": 2000},
        "wrk_cpu_ms": 1000,
        "wrk": {
            "requests": requests,
            "rps": rps,
            "errors": 0,
            "cache": cache,
            "latency_ms": {"p50": p50, "p90": p50, "p99": p50 * 2, "max": p50 * 3},
        },
    }


def test_the_cache_rows_and_targets_come_from_the_cache_modes() -> None:
    none = {"hit": 0, "store": 0, "miss": 0, "bypass": 0, "none": 1}
    runs = [
        run("direct", "cache-hit", 20000, 0.05, 10, none),
        # 10,000 hits in 100 ticks (1 s at 100 Hz): 0.1 ms a request; 9,990 said hit.
        run(
            "cache",
            "cache-hit",
            1000,
            0.25,
            100,
            {"hit": 9990, "store": 0, "miss": 10, "bypass": 0, "none": 0},
        ),
        run("gateway", "cache-hit", 800, 0.6, 80, none),
        run("direct", "cache-miss", 20000, 0.05, 10, none),
        # 4,000 misses in 60 ticks: 0.15 ms; cache off: 5,000 in 50 ticks, 0.1 ms.
        run(
            "cache", "cache-miss", 400, 1.0, 60, {"hit": 0, "store": 4000, "miss": 0, "bypass": 0, "none": 0}
        ),
        run("gateway", "cache-miss", 500, 0.6, 50, none),
    ]
    rows = report.summarize(report.derive(runs, 100))
    (row,) = report.cache_rows(rows)
    assert row["hit_added_p50_ms"] == 0.2
    assert row["hit_over_miss_rps"] == 2.5
    assert round(row["miss_cpu_us_over_off"], 6) == 50.0
    assert round(row["hit_cpu_us_over_off"], 6) == 0.0
    assert row["hit_share"] == 0.999 and row["store_share"] == 1.0
    checks = {c["check"]: c["ok"] for c in report.check_issue55([row])}
    assert checks == {
        "cache hit c=1 added p50 ms": True,
        "cache hits/misses req/s c=1": True,
        "cache miss cpu us/req over cache off c=1": False,
    }
    json.dumps(rows)  # the JSON the script writes
