"""Latency and throughput under upstream faults, through the gateway to two simulators.

1. One of two deployments hangs on 10% of requests: p50/p95/p99 end-to-end (streamed,
   to the last byte), hedging off vs on.
2. A full outage of one deployment (every request answered 503), with a fallback tier:
   throughput and errors, next to the same load with both deployments healthy.
3. ``load``: hung upstreams under load (issue #13 item 5): 32 closed-loop clients,
   non-stream, two deployments in one tier, each hanging before its headers on 10 % of
   requests; hedging off, then on. Errors %, seconds of the run without one successful
   answer, p50/p99, and whether both circuits were ever open at once.

    python bench/faults.py [--requests 400] [--concurrency 8] [--seconds 10]
    python bench/faults.py load [--clients 32] [--load-seconds 30] [--hang-rate 0.1]

Prints a table; exits 1 if any request of the outage run failed (``load``: if a
target is missed: < 0.5 % errors, no second without a success, p99 < 3 s hedging off
and < 1 s on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp
import orjson

from gateway.procutil import free_port, serving

BODY = {
    "model": "fast",
    "stream": True,
    "max_tokens": 16,
    "messages": [
        {"role": "system", "content": "You are a concise assistant for a shipping company."},
        {"role": "user", "content": "Where is my parcel?"},
    ],
}


@contextmanager
def sim(name: str, *faults: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "local_backend.sim", "--port", str(port), "--model", f"{name}:30:2"]
    for fault in faults:
        cmd += ["--fault", fault]
    with serving(cmd, f"http://127.0.0.1:{port}/health", stop_timeout_s=10):
        yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def gateway(policy: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    path = workdir / f"policy-{port}.yaml"
    path.write_text(policy)
    env = {**os.environ, "SWITCHYARD_LOG_LEVEL": "warning"}
    cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--policy", str(path)]
    with serving(cmd, f"http://127.0.0.1:{port}/healthz", env=env, stop_timeout_s=10):
        yield f"http://127.0.0.1:{port}/v1/chat/completions"


def policy(a: tuple[str, str], b: tuple[str, str], dispatch: str, tiers: str) -> str:
    """Deployments ``a`` and ``b`` on the simulators ``(base_url, model)``."""
    return f"""
deployments:
  a: {{base_url: "{a[0]}", model: {a[1]}}}
  b: {{base_url: "{b[0]}", model: {b[1]}}}
tiers:
{tiers}
dispatch:
{dispatch}
"""


async def one(session: aiohttp.ClientSession, url: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=BODY) as resp:
            data = await resp.read()
            ok = resp.status == 200 and data.rstrip().endswith(b"data: [DONE]") and b'"error"' not in data
    except aiohttp.ClientError:
        ok = False
    return time.perf_counter() - t0, ok


async def fixed_count(url: str, requests: int, concurrency: int) -> tuple[list[float], int]:
    slots = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def run() -> tuple[float, bool]:
            async with slots:
                return await one(session, url)

        results = await asyncio.gather(*(run() for _ in range(requests)))
    return [t for t, _ in results], sum(1 for _, ok in results if not ok)


async def for_seconds(url: str, seconds: float, concurrency: int) -> tuple[int, int]:
    deadline = time.perf_counter() + seconds
    done = errors = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                _, ok = await one(session, url)
                done += 1
                errors += 0 if ok else 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, errors


UNARY = {**BODY, "stream": False}


async def one_unary(session: aiohttp.ClientSession, url: str) -> tuple[float, float, bool]:
    """(start, seconds, ok): ok is a 200 whose body is a chat completion with content."""
    t0 = time.perf_counter()
    ok = False
    try:
        async with session.post(url, json=UNARY) as resp:
            data = await resp.read()
            if resp.status == 200:
                answer = orjson.loads(data)
                ok = bool(answer["choices"][0]["message"]["content"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
        ok = False
    return t0, time.perf_counter() - t0, ok


async def closed_loop(url: str, admin_url: str, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` loops, each sending its next request when the last one ended."""
    start = time.perf_counter()
    deadline = start + seconds
    results: list[tuple[float, float, bool]] = []
    both_open = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            while time.perf_counter() < deadline:
                results.append(await one_unary(session, url))

        async def watch_circuits() -> None:
            nonlocal both_open
            while time.perf_counter() < deadline:
                await asyncio.sleep(0.25)
                async with session.get(admin_url) as resp:
                    circuits = (await resp.json())["circuits"]
                if all(c["state"] == "open" for c in circuits.values()):
                    both_open += 1

        await asyncio.gather(watch_circuits(), *(worker() for _ in range(clients)))
    seconds_ok = {int(t0 + took - start) for t0, took, ok in results if ok}
    times = [took for _, took, _ in results]
    errors = sum(1 for *_, ok in results if not ok)
    return {
        "requests": len(results),
        "errors_pct": 100.0 * errors / max(1, len(results)),
        "dark_s": sum(1 for s in range(int(seconds)) if s not in seconds_ok),
        "p50_ms": pct(times, 0.50),
        "p99_ms": pct(times, 0.99),
        "both_open_polls": both_open,
    }


def load_case(args: argparse.Namespace, stack: ExitStack, workdir: Path) -> int:
    rate = args.hang_rate
    a = (stack.enter_context(sim("a", f"a:hang@{rate}")), "a")
    b = (stack.enter_context(sim("b", f"b:hang@{rate}")), "b")
    missed = False
    rows = []
    for label, hedge, p99_target_ms in (
        ("hedging off", "", 3000.0),
        ("hedging on", "  hedge: {enabled: true}\n", 1000.0),
    ):
        dispatch = f"  timeouts: {{first_byte_s: {args.first_byte_s}}}\n{hedge}"
        text = policy(a, b, dispatch, "  fast: [a, b]")
        with gateway(text, workdir) as url:
            admin_url = url.replace("/v1/chat/completions", "/readyz")
            asyncio.run(closed_loop(url, admin_url, args.clients, 3.0))  # warm-up, fills p95 windows
            got = asyncio.run(closed_loop(url, admin_url, args.clients, args.load_seconds))
        ok = got["errors_pct"] < 0.5 and got["dark_s"] == 0 and got["p99_ms"] < p99_target_ms
        missed |= not ok
        rows.append(
            f"| {label} | {got['requests']:.0f} | {got['errors_pct']:.2f} % | {got['dark_s']:.0f} | "
            f"{got['p50_ms']:.0f} | {got['p99_ms']:.0f} | {got['both_open_polls']:.0f} | "
            f"{'yes' if ok else 'NO'} |"
        )
    print(
        f"{args.clients} closed-loop clients for {args.load_seconds:.0f} s, non-stream; deployments a and b "
        f"in one tier, each hanging before its headers on {rate:.0%} of requests; "
        f"first_byte_s: {args.first_byte_s}; simulators: 30 ms to first token, 2 ms between tokens, 16 tokens"
    )
    print(
        "| hedging | requests | errors | seconds without a success | p50 ms | p99 ms "
        "| both circuits open (polls) | targets met |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if missed else 0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "case", nargs="?", choices=("latency", "load"), default="latency",
        help="latency: cases 1 and 2 (default); load: hung upstreams under load",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--hang-rate", type=float, default=0.1)
    parser.add_argument("--first-byte-s", type=float, default=0.5)
    args = parser.parse_args()
    rows: list[str] = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        if args.case == "load":
            return load_case(args, stack, workdir)
        a = (stack.enter_context(sim("a", "a:hang@0.1")), "a")
        b = (stack.enter_context(sim("b")), "b")
        timeouts = "  timeouts: {first_token_s: 1.0}\n"
        for label, hedge in (
            ("hedging off", ""),
            ("hedging on (after 150 ms)", "  hedge: {enabled: true, after_s: 0.15, budget_ratio: 0.2}\n"),
        ):
            text = policy(a, b, timeouts + "  circuit: {enabled: false}\n" + hedge, "  fast: [a, b]")
            with gateway(text, workdir) as url:
                asyncio.run(fixed_count(url, 40, args.concurrency))  # warm-up, also fills p95 windows
                times, errors = asyncio.run(fixed_count(url, args.requests, args.concurrency))
            rows.append(
                f"| a hangs on 10 %, {label} | {len(times)} | {errors} | "
                f"{statistics.median(times) * 1000:.0f} | {pct(times, 0.95):.0f} | {pct(times, 0.99):.0f} |"
            )
        healthy = (stack.enter_context(sim("up")), "up")
        down = (stack.enter_context(sim("down", "down:error=503")), "down")
        for label, first in (("both healthy", healthy), ("a down (503), fallback to b", down)):
            dispatch = "  fallback: {fast: [strong]}\n  retries: {backoff: {base_s: 0.01}}\n"
            text = policy(first, b, dispatch, "  fast: [a]\n  strong: [b]")
            with gateway(text, workdir) as url:
                asyncio.run(for_seconds(url, 1.0, args.concurrency))
                done, errors = asyncio.run(for_seconds(url, args.seconds, args.concurrency))
            failed |= errors > 0
            rows.append(f"| {label} | {done} | {errors} | {done / args.seconds:.0f} req/s | | |")
    print(f"concurrency {args.concurrency}; simulators: 30 ms to first token, 2 ms between tokens, 16 tokens")
    print("| scenario | requests | errors | p50 ms (or throughput) | p95 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
