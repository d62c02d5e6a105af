"""CPU cost per request of the telemetry bookkeeping, measured in isolation (no I/O):
Prometheus recording, the dashboard's and the cache report's counters, and tracing off vs
on (spans handed to a batch processor whose exporter drops them).

    .venv/bin/python bench/probes/telemetry_cost.py [--n 20000]
    # as with --workers N:
    PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) .venv/bin/python bench/probes/telemetry_cost.py

Prints microseconds per request for each part (best of 5 rounds). This complements
bench/overhead.sh, whose end-to-end numbers on a shared 2-core VM move by more than these
costs between runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gateway.cachestats import Accounting
from gateway.config import PolicyHolder
from gateway.context import RequestContext
from gateway.dashboard import DashboardStats
from gateway.store.writer import StatsWriter
from gateway.telemetry import tracing
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import finished_request


class _Drop(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _ctx(snapshot: Any) -> RequestContext:
    ctx = RequestContext(request_id="req_1", endpoint="/v1/chat/completions", snapshot=snapshot)
    ctx.deployment, ctx.tier, ctx.stream, ctx.status = "sim-fast", "fast", True, 200
    ctx.route_reason, ctx.attempts, ctx.key_id = "tier=fast; by=model", 1, "key_0123abcd"
    now = time.perf_counter()
    ctx.started, ctx.first_token_at, ctx.last_chunk_at, ctx.finished_at = now - 0.05, now - 0.04, now, now
    ctx.chunks = 20
    details = {"cached_tokens": 512}
    ctx.usage = {"prompt_tokens": 812, "completion_tokens": 20, "prompt_tokens_details": details}
    return ctx


def _best_us(fn: Callable[[], None], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    snapshot = PolicyHolder(None).current
    metrics = Metrics()
    writer = StatsWriter(None)  # type: ignore[arg-type]  # hincr never touches Redis
    accounting = Accounting(writer, None)  # type: ignore[arg-type]
    dashboard = DashboardStats(writer, None, accounting)  # type: ignore[arg-type]
    ctx = _ctx(snapshot)
    done = finished_request(ctx)

    def hooks_off() -> None:
        c = _ctx(snapshot)
        with tracing.child(c, "shape"):
            pass
        with tracing.child(c, "route"):
            pass
        tracing.first_token(c)
        tracing.inject(c, {})
        tracing.end_request(c, None)

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=1 << 16))
    on = tracing.Tracing(provider)

    def traced() -> None:
        c = _ctx(snapshot)
        token = on.start_request(c, "POST", {})
        with tracing.child(c, "shape"):
            pass
        with tracing.child(c, "route"):
            pass
        with tracing.attempt_span(c, "sim-fast", "fast", False, False) as span:
            headers: dict[str, str] = {}
            tracing.inject(c, headers)
            tracing.attempt_outcome(span, "ok")
        tracing.first_token(c)
        tracing.end_request(c, token)

    calls = 0

    def recorded() -> None:
        # The gateway adds its tallies to the metrics every quarter second: at 2,000
        # requests a second, one sync per 500 requests.
        nonlocal calls
        metrics.record(done)
        calls += 1
        if calls % 500 == 0:
            metrics.sync({}, {}, {}, 0, 0)

    mode = "multiprocess mode" if metrics.multiprocess else "single process"
    base = _best_us(lambda: _ctx(snapshot), n)
    rows = [
        ("finished_request (the record every sink reads)", _best_us(lambda: finished_request(ctx), n)),
        (f"Metrics.record + its share of a sync (Prometheus, {mode})", _best_us(recorded, n)),
        ("DashboardStats.record (counters for Redis)", _best_us(lambda: dashboard.record(done), n)),
        ("Accounting.record (cache, cost counters for Redis)", _best_us(lambda: accounting.record(done), n)),
        ("tracing off: every hook (minus making a ctx)", _best_us(hooks_off, n) - base),
        ("tracing on: request + 3 child spans (minus making a ctx)", _best_us(traced, n // 4) - base),
    ]
    for name, us in rows:
        print(f"{name:<58} {us:8.2f} us/request")
    provider.shutdown()


if __name__ == "__main__":
    main()
