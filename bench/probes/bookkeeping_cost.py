"""CPU per request of a finished request's bookkeeping: the record, and the log line, the
Prometheus tallies, the dashboard counters and the cache-report counters fed one record at
a time (as every request did before the batches) against buffered and folded per batch
(:mod:`gateway.telemetry.bookkeeping`), in one event loop, with the log's writer thread
writing to /dev/null.

    .venv/bin/python bench/probes/bookkeeping_cost.py [--batch 150]

``--batch`` is the records per fold (150: 50 ms at 3,000 requests a second). Prints the best
of 9 rounds of 3,000 requests, process CPU (the writer thread's included) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable

from telemetry_cost import _ctx  # this folder is sys.path[0] when run as a script

from gateway.cachestats import Accounting
from gateway.config import PolicyHolder
from gateway.dashboard import DashboardStats
from gateway.store.writer import StatsWriter
from gateway.telemetry import logging as tlog
from gateway.telemetry.bookkeeping import Bookkeeping
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import FinishedRequest, finished_request

ROUNDS, REQUESTS = 9, 3000


async def _best_us(batch: int, batched: bool) -> float:
    snapshot = PolicyHolder(None).current
    writer = StatsWriter(None)  # type: ignore[arg-type]  # counters never touch Redis
    accounting = Accounting(writer, None)  # type: ignore[arg-type]
    dashboard = DashboardStats(writer, None, accounting)  # type: ignore[arg-type]
    metrics = Metrics()
    batch_sinks = (accounting.record_many, dashboard.record_many, metrics.record_many, tlog.log_requests)
    book = Bookkeeping(batch_sinks)
    sinks: tuple[Callable[[FinishedRequest], None], ...] = (
        (book.add,) if batched else (accounting.record, dashboard.record, metrics.record, tlog.log_request)
    )
    contexts = [_ctx(snapshot) for _ in range(batch)]
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(REQUESTS // batch):
            for ctx in contexts:
                done = finished_request(ctx)
                for sink in sinks:
                    sink(done)
            book.flush()
            metrics.sync({}, {}, {}, 0, 0)
            await asyncio.sleep(0)  # the log's batch timer, as between two folds
        best = min(best, (time.process_time() - start) / (REQUESTS // batch * batch))
        writer._counters.clear()
        await asyncio.sleep(0.03)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=150)
    batch = parser.parse_args().batch
    tlog.configure(out=open(os.devnull, "wb"))  # noqa: SIM115 - the process's log, to its end
    for batched in (False, True, False, True):
        us = asyncio.run(_best_us(batch, batched))
        label = f"batched, {batch} per fold" if batched else "one record at a time"
        print(f"record + log, metrics, dashboard, cache stats: {label:<22} {us:6.2f} us CPU/request")


if __name__ == "__main__":
    main()
