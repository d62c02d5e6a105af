"""Hold N SSE chat streams open at once and time them (bench/overhead.sh --hold).

    python bench/hold.py --url http://127.0.0.1:PORT/v1/chat/completions --model canned-slow \\
        --streams 1000 --ramp-s 2 [--header 'Name: value'] [--pgid PGID] [--out FILE]

Opens ``--streams`` ``stream: true`` chat requests spread evenly over ``--ramp-s`` seconds
(each on its own connection), reads every stream to its end and prints one line,
``HOLD_RESULT {json}``: how many completed (status 200 and ``data: [DONE]`` seen), the
errors by kind, time to first byte (request sent -> first body bytes) and whole-stream
times (p50/p90/p99/max ms), the most streams open at once, and, with ``--pgid``, the peak
RSS of that process group (sampled every 50 ms; ``redis-server`` processes counted apart)
and its CPU time over the run. Against a slow upstream (overhead.sh's paced
``/slow/v1`` stream, ~5 s) every stream is open at the same time once the ramp is over.

Only aiohttp (the gateway's own dependency) and the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

DONE_MARKER = b"data: [DONE]"
RSS_SAMPLE_INTERVAL_S = 0.05


@dataclass(slots=True)
class StreamResult:
    """One stream's timings (seconds from its request being sent) and outcome."""

    ttfb_s: float | None = None
    total_s: float | None = None
    status: int = 0
    complete: bool = False
    error: str | None = None
    body_bytes: int = 0


@dataclass(slots=True)
class Gauge:
    """Streams open right now, and the most at once."""

    open_now: int = 0
    open_peak: int = 0

    def up(self) -> None:
        self.open_now += 1
        self.open_peak = max(self.open_peak, self.open_now)

    def down(self) -> None:
        self.open_now -= 1


@dataclass(slots=True)
class GroupSample:
    """Peak RSS and CPU ticks of a process group, from /proc."""

    pgid: int
    rss_peak_kb: int = 0
    redis_rss_peak_kb: int = 0
    processes_at_peak: int = 0
    cpu_ticks: list[int] = field(default_factory=list)


def group_snapshot(pgid: int) -> tuple[int, int, int, int]:
    """(RSS kB without redis-server, redis-server RSS kB, processes, utime+stime ticks) of
    every live process in the group ``pgid``."""
    rss_kb = redis_kb = procs = ticks = 0
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # After "pid (comm) ": state ppid pgrp ... utime(11) stime(12) ... rss(21) in pages.
        if int(fields[2]) != pgid:
            continue
        rss = int(fields[21]) * page_kb
        if comm == "redis-server":
            redis_kb += rss
        else:
            rss_kb += rss
            procs += 1
            ticks += int(fields[11]) + int(fields[12])
    return rss_kb, redis_kb, procs, ticks


async def sample_rss(group: GroupSample, stop: asyncio.Event) -> None:
    """Every 50 ms until ``stop``: keep the group's peak RSS."""
    while True:
        rss_kb, redis_kb, procs, _ = group_snapshot(group.pgid)
        if rss_kb > group.rss_peak_kb:
            group.rss_peak_kb, group.processes_at_peak = rss_kb, procs
        group.redis_rss_peak_kb = max(group.redis_rss_peak_kb, redis_kb)
        try:
            await asyncio.wait_for(stop.wait(), RSS_SAMPLE_INTERVAL_S)
            return
        except TimeoutError:
            pass


def request_body(model: str) -> bytes:
    """A short chat request (the hold test is about open streams, not request bytes)."""
    return json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [
                {"role": "system", "content": "You are a concise support assistant."},
                {"role": "user", "content": "Where is my order A-10432?"},
            ],
            "max_tokens": 64,
        }
    ).encode()


async def one_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    delay_s: float,
    timeout_s: float,
    gauge: Gauge,
) -> StreamResult:
    """Wait ``delay_s`` (its place in the ramp), then send one stream request and read it to the end."""
    await asyncio.sleep(delay_s)
    result = StreamResult()
    started = time.perf_counter()
    tail = b""
    gauge.up()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                result.status = resp.status
                async for chunk in resp.content.iter_any():
                    if result.ttfb_s is None:
                        result.ttfb_s = time.perf_counter() - started
                    result.body_bytes += len(chunk)
                    # Keep only enough of the end to find the marker across a chunk boundary.
                    tail = (tail + chunk)[-64:]
        result.total_s = time.perf_counter() - started
        result.complete = result.status == 200 and DONE_MARKER in tail
        if result.status != 200:
            result.error = f"status_{result.status}"
        elif not result.complete:
            result.error = "incomplete"
    except TimeoutError:
        result.error = "timeout"
    except aiohttp.ClientError as exc:
        result.error = type(exc).__name__
    except OSError as exc:
        result.error = f"os_{exc.errno}"
    finally:
        gauge.down()
    return result


def percentiles_ms(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max in ms (nearest rank), None when there are no values."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))] * 1000.0

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": ordered[-1] * 1000.0}


async def hold(args: argparse.Namespace) -> dict[str, Any]:
    """Run the streams and return the summary."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    headers["Authorization"] = f"Bearer {args.api_key}"
    for raw in args.header:
        name, _, value = raw.partition(":")
        headers[name.strip()] = value.strip()
    body = request_body(args.model)
    gauge = Gauge()
    groups = [GroupSample(pgid) for pgid in args.pgid]
    ticks_before = [group_snapshot(g.pgid)[3] for g in groups]
    stop = asyncio.Event()
    samplers = [asyncio.create_task(sample_rss(g, stop)) for g in groups]
    # One connection per stream, no pool limit: each stream is a client of its own.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        step_s = args.ramp_s / args.streams
        results = await asyncio.gather(
            *(
                one_stream(session, args.url, body, headers, i * step_s, args.timeout_s, gauge)
                for i in range(args.streams)
            )
        )
    elapsed_s = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*samplers)
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    summary: dict[str, Any] = {
        "label": args.label,
        "streams": args.streams,
        "ramp_s": args.ramp_s,
        "complete": sum(r.complete for r in results),
        "errors": sum(errors.values()),
        "errors_detail": errors,
        "open_peak": gauge.open_peak,
        "elapsed_s": round(elapsed_s, 3),
        "ttfb_ms": percentiles_ms([r.ttfb_s for r in results if r.ttfb_s is not None]),
        "stream_ms": percentiles_ms([r.total_s for r in results if r.total_s is not None]),
        "body_bytes_p50": sorted(r.body_bytes for r in results)[len(results) // 2] if results else 0,
    }
    if groups:
        clk_tck = os.sysconf("SC_CLK_TCK")
        summary["groups"] = [
            {
                "pgid": g.pgid,
                "rss_peak_kb": g.rss_peak_kb,
                "redis_rss_peak_kb": g.redis_rss_peak_kb,
                "processes_at_peak": g.processes_at_peak,
                "cpu_ms": (group_snapshot(g.pgid)[3] - before) * 1000.0 / clk_tck,
            }
            for g, before in zip(groups, ticks_before, strict=True)
        ]
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="the chat completions URL")
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, default=1000, help="streams to hold open (default 1000)")
    parser.add_argument("--ramp-s", type=float, default=2.0, help="open them evenly over this many seconds")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="give up on one stream after this long")
    parser.add_argument("--api-key", default="sk-bench-dummy", help="sent as the bearer token")
    parser.add_argument("--header", action="append", default=[], help="an extra 'Name: value' header")
    parser.add_argument("--pgid", type=int, action="append", default=[], help="a process group to watch")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", help="also write the summary JSON here")
    args = parser.parse_args(argv)
    if args.streams < 1 or args.ramp_s < 0:
        parser.error("--streams must be >= 1 and --ramp-s >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run: Any = asyncio.run
    try:
        # The gateway's venv has uvloop; the driver must not be the bottleneck.
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    summary = run(hold(args))
    line = json.dumps(summary)
    print(f"HOLD_RESULT {line}", flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
