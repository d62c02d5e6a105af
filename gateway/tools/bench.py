"""``switchyard bench``: a latency regression suite.

``bench run WORKLOAD.yaml --out RESULT.json`` replays a workload (prompt shapes, stream
share, concurrency, duration) against any OpenAI-compatible base URL — a gateway in front
of the simulator or of a real upstream — and records TTFT, inter-token latency and
end-to-end p50/p95/p99 per shape, measured at the client. ``bench compare BASELINE.json
RESULT.json --max-regression 10%`` prints a table and exits 1 when any p95 grew by more
than the bound (and by more than ``--min-delta-ms``, so sub-millisecond noise never fails).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from pydantic import Field, ValidationError

from gateway.validation import Seconds, StrictModel, format_loc

METRICS = ("ttft_ms", "itl_ms", "e2e_ms")
RESULT_VERSION = 1
_WORDS = ("signal", "yard", "switch", "track", "freight", "engine", "junction", "siding", "rail", "timetable")


class Shape(StrictModel):
    """One kind of request in the mix."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    weight: float = Field(1.0, gt=0)
    prompt_tokens: int = Field(200, ge=1, description="prompt length, at ~4 characters a token")
    shared_prefix_tokens: int = Field(
        0, ge=0, description="of which the first N are the same in every request (a cacheable prefix)"
    )
    max_tokens: int = Field(64, ge=1)
    model: str | None = Field(None, description="default: the workload's model")


class Workload(StrictModel):
    """A workload file."""

    name: str = "workload"
    base_url: str = Field("http://127.0.0.1:8080/v1", description="OpenAI-compatible base URL (…/v1)")
    api_key: str = "unused"
    model: str = "auto"
    concurrency: int = Field(4, ge=1, le=1024)
    duration_s: Seconds = Field(10.0, gt=0)
    warmup_s: Seconds = Field(1.0, ge=0, description="requests started before this are not recorded")
    stream_share: float = Field(0.5, ge=0, le=1)
    timeout_s: Seconds = Field(60.0, gt=0)
    seed: int = 0
    shapes: list[Shape] = Field(min_length=1)


def load_workload(path: str) -> Workload:
    """Parse and validate a workload file; raises ``ValueError`` with every problem's location."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {problems}") from None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0-1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(values: list[float]) -> dict[str, Any]:
    """``{count, mean, p50, p95, p99}`` of millisecond samples (rounded to the microsecond)."""

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "count": len(values),
        "mean": r(sum(values) / len(values)) if values else None,
        "p50": r(percentile(values, 0.50)),
        "p95": r(percentile(values, 0.95)),
        "p99": r(percentile(values, 0.99)),
    }


@dataclass(slots=True)
class _Samples:
    requests: int = 0
    streams: int = 0
    errors: int = 0
    by_metric: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})


def _prompt(shape: Shape, rng: random.Random) -> str:
    # ~4 characters a token (OpenAI's rule of thumb and the simulator's tokenizer).
    shared = shape.shared_prefix_tokens * 4
    total = shape.prompt_tokens * 4
    head = " ".join(_WORDS[i % len(_WORDS)] for i in range(total // 7 + 1))[:shared]
    salt = f" request {rng.getrandbits(64):016x}: "
    rest = " ".join(rng.choice(_WORDS) for _ in range(max(0, total - len(head)) // 6 + 1))
    return (head + salt + rest)[: max(total, len(head) + len(salt))]


async def _one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], stream: bool, out: _Samples
) -> None:
    started = time.perf_counter()
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"HTTP {resp.status}")
        if not stream:
            await resp.read()
            out.by_metric["e2e_ms"].append((time.perf_counter() - started) * 1000.0)
            return
        first: float | None = None
        last = started
        tokens = 0
        done = False
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.removeprefix(b"data: ").strip()
                if data == b"[DONE]":
                    done = True
                    continue
                if b'"content"' not in data:
                    continue
                parsed = orjson.loads(data)
                if "error" in parsed:
                    raise RuntimeError(str(parsed["error"]))
                choices = parsed.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    last = now
                    tokens += 1
        if not done or first is None:
            raise RuntimeError("the stream ended early")
        end = time.perf_counter()
        out.by_metric["ttft_ms"].append((first - started) * 1000.0)
        if tokens > 1:
            out.by_metric["itl_ms"].append((last - first) * 1000.0 / (tokens - 1))
        out.by_metric["e2e_ms"].append((end - started) * 1000.0)


async def run_workload(workload: Workload, base_url: str | None = None) -> dict[str, Any]:
    """Replay ``workload`` for its duration; the result document."""
    base = (base_url or workload.base_url).rstrip("/")
    url = base + "/chat/completions"
    rng = random.Random(workload.seed)
    shapes = list(workload.shapes)
    weights = [s.weight for s in shapes]
    samples = {s.name: _Samples() for s in shapes}
    error_messages: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from = start + workload.warmup_s
    stop = record_from + workload.duration_s
    timeout = aiohttp.ClientTimeout(total=workload.timeout_s)
    headers = {"Authorization": f"Bearer {workload.api_key}"}
    connector = aiohttp.TCPConnector(limit=workload.concurrency, force_close=False)

    async def worker(session: aiohttp.ClientSession) -> None:
        while loop.time() < stop:
            shape = rng.choices(shapes, weights)[0]
            stream = rng.random() < workload.stream_share
            body: dict[str, Any] = {
                "model": shape.model or workload.model,
                "messages": [{"role": "user", "content": _prompt(shape, rng)}],
                "max_tokens": shape.max_tokens,
                "stream": stream,
            }
            recorded = loop.time() >= record_from
            out = samples[shape.name] if recorded else _Samples()
            try:
                await _one(session, url, body, stream, out)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                if recorded:
                    out.errors += 1
                    key = f"{type(exc).__name__}: {exc}"[:200]
                    error_messages[key] = error_messages.get(key, 0) + 1
            if recorded:
                out.requests += 1
                out.streams += int(stream)

    wall_started = time.time()
    async with aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(workload.concurrency)))
    elapsed = max(1e-9, loop.time() - record_from)
    everything = _Samples()
    for s in samples.values():
        everything.requests += s.requests
        everything.streams += s.streams
        everything.errors += s.errors
        for metric in METRICS:
            everything.by_metric[metric].extend(s.by_metric[metric])

    def shaped(s: _Samples) -> dict[str, Any]:
        return {
            "requests": s.requests,
            "streams": s.streams,
            "errors": s.errors,
            **{metric: summarize(s.by_metric[metric]) for metric in METRICS},
        }

    return {
        "version": RESULT_VERSION,
        "workload": workload.name,
        "base_url": base,
        "started_at": wall_started,
        "duration_s": round(elapsed, 3),
        "concurrency": workload.concurrency,
        "stream_share": workload.stream_share,
        "requests": everything.requests,
        "errors": everything.errors,
        "error_messages": error_messages,
        "requests_per_s": round(everything.requests / elapsed, 2),
        "all": shaped(everything),
        "shapes": {name: shaped(s) for name, s in samples.items()},
    }


def parse_ratio(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a ratio: {text!r} (use 10% or 0.1)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the regression bound cannot be negative")
    return value


@dataclass(slots=True)
class Row:
    """One line of ``bench compare``: a shape's metric, its two p95s and the verdict."""

    shape: str
    metric: str
    base: float | None
    new: float | None
    change: float | None
    regressed: bool


def compare(
    base: dict[str, Any], new: dict[str, Any], max_regression: float, min_delta_ms: float
) -> list[Row]:
    """p95 of every metric of every shape in ``base``, against ``new``."""
    rows = []
    for shape, base_stats in base["shapes"].items():
        new_stats = new["shapes"].get(shape)
        for metric in METRICS:
            old = base_stats[metric]["p95"]
            now = new_stats[metric]["p95"] if new_stats is not None else None
            if old is None and now is None:
                continue
            change = (now - old) / old if old and now is not None else None
            regressed = (
                change is not None
                and change > max_regression
                and now is not None
                and old is not None
                and now - old > min_delta_ms
            )
            rows.append(Row(shape, metric, old, now, change, regressed))
    return rows


def format_table(rows: list[Row], max_regression: float) -> str:
    """The comparison as a fixed-width table, one row per shape and metric."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    lines = [
        f"{'shape':<16} {'metric':<8} {'base p95 ms':>12} {'new p95 ms':>12} {'change':>9}  verdict",
        "-" * 70,
    ]
    for row in rows:
        change = "-" if row.change is None else f"{row.change * 100:+.1f}%"
        if row.new is None:
            verdict = "MISSING"
        elif row.regressed:
            verdict = f"REGRESSED (> {max_regression * 100:g}%)"
        else:
            verdict = "ok"
        lines.append(
            f"{row.shape:<16} {row.metric:<8} {ms(row.base):>12} {ms(row.new):>12} {change:>9}  {verdict}"
        )
    return "\n".join(lines)


def _read_result(path: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != RESULT_VERSION or "shapes" not in data:
        raise ValueError(f"{path}: not a 'switchyard bench run' result (version {RESULT_VERSION})")
    return data


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        workload = load_workload(args.workload)
    except ValueError as exc:
        print(f"switchyard bench: {exc}", file=sys.stderr)
        return 2
    if args.duration is not None:
        workload = workload.model_copy(update={"duration_s": args.duration})
    result = asyncio.run(run_workload(workload, args.base_url))
    Path(args.out).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(
        f"{workload.name}: {result['requests']} requests ({result['errors']} errors) in "
        f"{result['duration_s']}s, {result['requests_per_s']} req/s -> {args.out}"
    )
    for name, stats in result["shapes"].items():
        parts = [
            f"{metric} p50/p95/p99 {stats[metric]['p50']}/{stats[metric]['p95']}/{stats[metric]['p99']}"
            for metric in METRICS
            if stats[metric]["count"]
        ]
        print(f"  {name:<16} n={stats['requests']:<5} " + "  ".join(parts))
    if result["requests"] == 0 or result["errors"] == result["requests"]:
        print("switchyard bench: no request succeeded", file=sys.stderr)
        for message, count in result["error_messages"].items():
            print(f"  {count} x {message}", file=sys.stderr)
        return 1
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    try:
        base, new = _read_result(args.baseline), _read_result(args.result)
    except ValueError as exc:
        print(f"switchyard bench: {exc}", file=sys.stderr)
        return 2
    rows = compare(base, new, args.max_regression, args.min_delta_ms)
    print(format_table(rows, args.max_regression))
    failed = [r for r in rows if r.regressed or r.new is None]
    if failed:
        bound = f"{args.max_regression * 100:g}%"
        print(f"\n{len(failed)} p95 figure(s) regressed by more than {bound} or are missing")
        return 1
    print(f"\nno p95 regressed by more than {args.max_regression * 100:g}%")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``switchyard bench run | compare``."""
    p = sub.add_parser("bench", help="latency regression suite: replay a workload, compare results")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    run = bsub.add_parser("run", help="replay a workload; write TTFT/ITL/e2e percentiles per shape")
    run.add_argument("workload", help="workload YAML (see bench/workload.yaml)")
    run.add_argument("--out", required=True, help="result JSON")
    run.add_argument(
        "--base-url",
        default=os.environ.get("SWITCHYARD_BENCH_URL"),
        help="OpenAI-compatible base URL (…/v1); default: the workload's base_url (SWITCHYARD_BENCH_URL)",
    )
    run.add_argument("--duration", type=float, help="seconds to record (overrides the workload's duration_s)")
    run.set_defaults(func=_cmd_run)
    cmp = bsub.add_parser("compare", help="exit 1 when any p95 regressed beyond the bound")
    cmp.add_argument("baseline")
    cmp.add_argument("result")
    cmp.add_argument("--max-regression", type=parse_ratio, default=0.10, help="e.g. 10%% (default) or 0.1")
    cmp.add_argument(
        "--min-delta-ms",
        type=float,
        default=1.0,
        help="a p95 that grew by less than this many ms never fails (default 1.0)",
    )
    cmp.set_defaults(func=_cmd_compare)
