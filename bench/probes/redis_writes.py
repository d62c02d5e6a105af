"""Event-loop CPU of the gateway's batched Redis calls (issue #20): a stats flush
(:meth:`gateway.store.writer.StatsWriter.flush`), a batch of cache expectations
(:func:`gateway.cachestats.prefix.expect_shared`), the stability model's load of many
templates (:meth:`gateway.shaping.stability.StabilityModel.sync`) and the dashboard's
report (``GET /admin/dashboard``: :meth:`gateway.dashboard.DashboardStats.report`, with
the cache report in it), against a redis-server of its own.

    .venv/bin/python bench/probes/redis_writes.py [--redis-server PATH] [--tree DIR]

Both run on the gateway's event loop every 100 ms, and while one runs no request moves.
The flush is the shape the overhead benchmark's full gateway sends every 100 ms (five
hashes of four fields, one capped list). The expectations are batches of 1, 20 and 200
requests from 50 conversations that share a 20-checkpoint system prompt, each request one
checkpoint longer than its conversation's previous one. Prints the median wall time and
this thread's CPU time per call (and per request for the expectations), and the total of
the expected checkpoints (the same for two trees that agree). The stability load is 500
templates with 80 line counts in each of two hours, the most the periodic sync reads at
once; it prints the wall and CPU time of the whole load and the lines loaded. The
dashboard's report reads the page's default window, an hour, of three deployments, ten
keys and five templates (900 dashboard and 1,200 cache counters a minute); it prints the
wall and CPU time and the requests counted. So does the cache report (``GET /admin/stats``)
of ten minutes of 500 templates on three deployments and three keys, and the spend per
day (``GET /admin/costs?days=30``) of 100 keys on three deployments. ``--tree``: import
``gateway`` from another checkout (e.g. ``git archive`` of an older commit) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def _timed(call: Any, rounds: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``await call()``."""
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.thread_time()
        await call()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return sorted(walls)[rounds // 2], sorted(cpus)[rounds // 2]


async def run(socket_path: str) -> None:
    from redis.asyncio import Redis

    from gateway.cachestats import _DAY_METRICS, BUCKET_S, METRICS, Accounting, _bucket, _day, _day_key
    from gateway.cachestats.prefix import expect_shared
    from gateway.config import parse_policy
    from gateway.dashboard import DashboardStats, _minute_key
    from gateway.shaping.stability import COUNT_FIELD, HOUR_S, StabilityModel, _key
    from gateway.store.writer import StatsWriter

    client = Redis(unix_socket_path=socket_path)
    writer = StatsWriter(client)

    def add(key: str, field: str, amount: int) -> None:
        if not hasattr(writer, "counters"):  # a tree from before the counters by prefix
            writer.hincr(key, field, amount, 3_600)  # type: ignore[attr-defined]
            return
        counters = writer.counters(key, "", 3_600)
        counters[field] = counters.get(field, 0) + amount

    async def flush() -> None:
        for i in range(5):
            for field in ("requests", "prompt_tokens", "cached_tokens", "cost"):
                add(f"bench:stats:{i}", field, 3)
        writer.push("bench:recent", b"x" * 100, 100, 3_600)
        writer.push("bench:recent", b"y" * 100, 100, 3_600)
        await writer.flush()

    await _timed(flush, 200)  # warm up
    wall, cpu = await _timed(flush, 2_000)
    print(f"stats flush (5 hashes x 4 fields, 1 list): wall {wall * 1e3:.3f} ms, CPU {cpu * 1e3:.3f} ms")

    rnd = random.Random(1)
    shared = [rnd.getrandbits(32) for _ in range(20)]
    conversations = [shared + [rnd.getrandbits(32) for _ in range(10)] for _ in range(50)]
    for size, rounds in ((1, 200), (20, 100), (200, 20)):
        total = 0

        async def expect(size: int = size) -> None:
            nonlocal total
            batch = []
            for _ in range(size):
                chain = rnd.choice(conversations)
                chain.append(rnd.getrandbits(32))
                batch.append(("bench", list(chain), 300.0))
            total += sum(await expect_shared(client, batch))

        wall, cpu = await _timed(expect, rounds)
        print(
            f"expectations, {size:3d} requests a batch: wall {wall * 1e3:7.2f} ms, CPU {cpu * 1e3:7.2f} ms"
            f" ({cpu * 1e6 / size:7.1f} us a request); expected tokens in all {total}"
        )

    templates = [f"bench-{i}" for i in range(500)]
    hour = int(time.time()) // HOUR_S
    pipe = client.pipeline(transaction=False)
    for name in templates:
        for h in (hour, hour - 1):
            counts = {f"{rnd.getrandbits(64):016x}": rnd.randint(1, 300) for _ in range(80)}
            pipe.hset(_key(name, h), mapping={**counts, COUNT_FIELD: 300})
    await pipe.execute()
    model = StabilityModel()

    async def load() -> None:
        for name in templates:
            model.observe(name, [], None)
        await model._load(client, templates)

    wall, cpu = await _timed(load, 5)
    lines = sum(len(model._templates[name].lines) for name in templates)
    print(
        f"stability load, 500 templates x 2 hours x 80 lines: wall {wall * 1e3:.1f} ms,"
        f" CPU {cpu * 1e3:.1f} ms; {lines} lines"
    )

    deployments = ["d-fast", "d-strong", "d-local"]
    now_min = int(time.time()) // BUCKET_S
    for minute in range(now_min - 60, now_min + 1):
        dash: dict[str, int] = {}
        cache: dict[str, int] = {}
        for deployment in deployments:
            for k in range(10):
                prefix = f"{deployment}|key_{k:08x}|"
                dash.update({prefix + m: 7 for m in ("requests", "errors", "cost_nusd", "tier:fast")})
                dash.update({prefix + f"h:e2e:{100 + b}": 3 for b in range(10)})
                dash.update({prefix + f"h:{lat}:{80 + b}": 2 for lat in ("ttft", "itl") for b in range(8)})
                cache.update({f"{prefix}{t:016x}|{m}": 1_000 for t in range(5) for m in METRICS})
        await client.hset(_minute_key(minute), mapping=dash)  # type: ignore[arg-type]
        await client.hset(_bucket(minute), mapping=cache)  # type: ignore[arg-type]
    policy = parse_policy(
        "deployments: {" + ", ".join(f"{d}: {{base_url: 'http://x'}}" for d in deployments) + "}\n"
        "tiers: {fast: [d-fast]}\n",
        "bench",
    )
    dashboard = DashboardStats(writer, client, Accounting(writer, client))
    counted = 0

    async def report() -> None:
        nonlocal counted
        counted = (await dashboard.report(policy, 3_600))["totals"]["requests"]

    wall, cpu = await _timed(report, 3)
    print(f"dashboard report, 1 h: wall {wall * 1e3:.0f} ms, CPU {cpu * 1e3:.0f} ms; {counted} requests")

    # The cache report of many templates: 500 of them, on 3 deployments and 3 keys.
    for minute in range(now_min - 9, now_min + 1):
        cache = {
            f"{d}|key_{k}|tpl{t:04d}|{m}": 1_000
            for d in deployments
            for k in range(3)
            for t in range(500)
            for m in METRICS
        }
        await client.hset(_bucket(minute), mapping=cache)  # type: ignore[arg-type]
    accounting = Accounting(writer, client)

    async def cache_report() -> None:
        nonlocal counted
        counted = (await accounting.report(policy, 600))["totals"]["requests"]

    wall, cpu = await _timed(cache_report, 3)
    print(
        f"cache report, 10 min of 500 templates: wall {wall * 1e3:.0f} ms,"
        f" CPU {cpu * 1e3:.0f} ms; {counted} requests"
    )

    # Spend per day (GET /admin/costs?days=30): 100 keys on 3 deployments a day.
    for i in range(30):
        spend = {
            f"key_{k:04d}|{d}|{m}": 1_000 + k for k in range(100) for d in deployments for m in _DAY_METRICS
        }
        await client.hset(_day_key(_day(time.time() - i * 86_400)), mapping=spend)  # type: ignore[arg-type]

    async def costs() -> None:
        nonlocal counted
        counted = sum(day["requests"] for day in (await accounting.costs(30))["days"])

    wall, cpu = await _timed(costs, 3)
    print(f"costs, 30 days of 100 keys: wall {wall * 1e3:.0f} ms, CPU {cpu * 1e3:.0f} ms; {counted} requests")
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--tree", type=Path, help="import gateway from this checkout")
    args = parser.parse_args()
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = f"{tmp}/redis.sock"
        server = subprocess.Popen(
            [
                args.redis_server,
                "--port",
                "0",
                "--unixsocket",
                socket_path,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                if Path(socket_path).exists():
                    break
                time.sleep(0.05)
            asyncio.run(run(socket_path))
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
