"""Cost of the learning loop on the request path: the shadow decision and the drift sink.

    python bench/probes/shadow_decision.py [--runs 200000]

Prints the median and p99 nanoseconds per call (perf_counter around batches of 100 calls,
after a warm-up) of

- ``ShadowSampler.after_answer`` for a request that is not sampled, with the shadow block
  absent (the default) and with ``share: 0.02`` (one random draw that says no);
- ``DriftMonitor.record`` for a classifier decision (window append, expiry, verdict);
- ``Metrics.record`` with and without a routing decision on the record (the new counter
  and histogram observation).

No sampled request is timed: a sampled one only starts a task, and its call runs off the
client's path.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from gateway.config import PolicyHolder, PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.providers.pool import UpstreamPool
from gateway.routing.drift import DriftMonitor
from gateway.routing.resolve import Route
from gateway.routing.shadow import ShadowSampler
from gateway.store.writer import StatsWriter
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import finished_request

POLICY = """
deployments:
  a: {base_url: "http://127.0.0.1:1/v1"}
  b: {base_url: "http://127.0.0.1:1/v1"}
tiers: {fast: [a], strong: [b]}
routing:
  classifier: {name: linear, bias: 0.0, weights: {}}
  calibration: {strong_share: 0.3}
"""
SHADOW = "  shadow: {share: 0.02}\n"


def timed(label: str, call: Callable[[], object], runs: int) -> None:
    batch = 100
    for _ in range(2000):
        call()
    samples = []
    for _ in range(runs // batch):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        samples.append((time.perf_counter() - start) / batch * 1e9)
    samples.sort()
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(f"{label:58} median {statistics.median(samples):7.0f} ns   p99 {p99:7.0f} ns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200_000)
    args = parser.parse_args()
    # The drift warning fires once here (the bench's traffic is all fast): not timed, not shown.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    body = {"model": "auto", "messages": [{"role": "user", "content": "Hello there"}]}
    route = Route("fast", ("a",), "score", 0.21, 0.5)
    for label, text in (
        ("after_answer, shadow off (default)", POLICY),
        ("after_answer, share 0.02, not sampled", POLICY + SHADOW),
    ):
        snapshot = PolicySnapshot(parse_policy(text, "p"), source="p", digest="", version=1)
        # A draw that never samples, so every call is the not-sampled path.
        shadow = ShadowSampler(UpstreamPool(), lambda n: True, StatsWriter(None), None, draw=lambda: 0.5)  # type: ignore[arg-type]
        ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=snapshot)
        timed(label, lambda s=shadow, c=ctx: s.after_answer(c, route, body, b"{}"), args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(POLICY)
        holder = PolicyHolder(str(path))
        ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=holder.current)
        ctx.route, ctx.tier, ctx.deployment, ctx.status = route, "fast", "a", 200
        ctx.finished_at = ctx.started + 0.05
        done = finished_request(ctx)
        monitor = DriftMonitor(holder)
        timed("DriftMonitor.record, a classifier decision", lambda: monitor.record(done), args.runs)
        metrics = Metrics()
        plain = replace(done, route=None)
        timed("Metrics.record without a routing decision", lambda: metrics.record(plain), args.runs)
        timed("Metrics.record with a routing decision", lambda: metrics.record(done), args.runs)


if __name__ == "__main__":
    main()
