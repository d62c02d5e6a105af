"""The finished requests' bookkeeping done per batch: every record reaches every batch sink,
in order, whenever the buffer is folded (by the task, a reader asking first, a full buffer,
or the stop), and what a batch writes is what the same requests wrote one at a time."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Sequence

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.cachestats import Accounting
from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.dashboard import DashboardStats
from gateway.dispatch.dispatcher import Dispatcher
from gateway.http import ops
from gateway.http.state import BOOKKEEPING, DISPATCHER, METRICS
from gateway.providers.pool import UpstreamPool
from gateway.store.writer import StatsWriter
from gateway.telemetry import bookkeeping
from gateway.telemetry import logging as tlog
from gateway.telemetry.bookkeeping import Bookkeeping
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import FinishedRequest, finished_request

POLICY = parse_policy(
    """
deployments:
  priced: {base_url: "http://x", price: {input: 2.0, cached_input: 0.5, output: 8.0}}
tiers: {fast: [priced]}
""",
    "p",
)
SNAPSHOT = PolicySnapshot(policy=POLICY, source="p", digest="d", version=1)


def _done(n: int, status: int = 200, stream: bool = False) -> FinishedRequest:
    ctx = RequestContext(request_id=f"r{n}", endpoint="/v1/chat/completions", snapshot=SNAPSHOT)
    ctx.deployment, ctx.tier, ctx.status, ctx.key_id, ctx.stream = "priced", "fast", status, "key_1", stream
    ctx.usage = {
        "prompt_tokens": 100 + n,
        "completion_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": n},
    }
    now = time.perf_counter()
    ctx.started, ctx.first_token_at, ctx.last_chunk_at, ctx.finished_at = now - 0.05, now - 0.04, now, now
    ctx.chunks = 5
    return finished_request(ctx)


class _Seen:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, batch: Sequence[FinishedRequest]) -> None:
        self.batches.append([d.request_id for d in batch])


def test_a_fold_hands_every_buffered_record_to_every_sink_in_order() -> None:
    first, second = _Seen(), _Seen()
    book = Bookkeeping((first, second))
    for n in range(3):
        book.add(_done(n))
    assert first.batches == [] and book.pending == 3  # nothing folded on the request path
    book.flush()
    assert first.batches == second.batches == [["r0", "r1", "r2"]]
    book.flush()  # an empty buffer calls no sink
    assert len(first.batches) == 1 and book.pending == 0


def test_a_full_buffer_is_folded_at_once() -> None:
    seen = _Seen()
    book = Bookkeeping((seen,))
    for n in range(bookkeeping.MAX_BATCH):
        book.add(_done(n))
    assert [len(b) for b in seen.batches] == [bookkeeping.MAX_BATCH] and book.pending == 0


def test_a_failing_sink_costs_the_other_sinks_nothing() -> None:
    def broken(batch: Sequence[FinishedRequest]) -> None:
        raise RuntimeError("boom")

    seen = _Seen()
    book = Bookkeeping((broken, seen))
    book.add(_done(1))
    book.flush()
    assert seen.batches == [["r1"]] and book.failures == 1


def test_the_task_folds_as_it_goes_and_at_the_stop_and_after_it() -> None:
    seen = _Seen()

    async def run() -> Bookkeeping:
        book = Bookkeeping((seen,), interval_s=0.001)
        task = asyncio.create_task(book.run())
        book.add(_done(1))
        for _ in range(5000):
            if seen.batches:
                break
            await asyncio.sleep(0.001)
        assert seen.batches == [["r1"]]
        task.cancel()
        book = Bookkeeping((seen,), interval_s=3600)
        task = asyncio.create_task(book.run())
        await asyncio.sleep(0)
        book.add(_done(2))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen.batches[-1] == ["r2"]  # folded on the way out, not an hour later
        return book

    book = asyncio.run(run())
    book.add(_done(3))  # a request that ends after the stop (a drain's last one)
    assert seen.batches[-1] == ["r3"]


def test_a_batch_writes_what_the_same_requests_wrote_one_at_a_time() -> None:
    records = [_done(n, status=200 if n % 3 else 500, stream=n % 2 == 0) for n in range(20)]

    def sinks() -> tuple[StatsWriter, Metrics, Accounting, DashboardStats]:
        writer = StatsWriter(None)  # type: ignore[arg-type]  # counters never touch Redis
        accounting = Accounting(writer, None)  # type: ignore[arg-type]
        return writer, Metrics(), accounting, DashboardStats(writer, None, accounting)  # type: ignore[arg-type]

    one_writer, one_metrics, one_acc, one_dash = sinks()
    for done in records:
        one_acc.record(done)
        one_dash.record(done)
        one_metrics.record(done)
    many_writer, many_metrics, many_acc, many_dash = sinks()
    book = Bookkeeping((many_acc.record_many, many_dash.record_many, many_metrics.record_many))
    for done in records:
        book.add(done)
    book.flush()
    assert many_writer._counters == one_writer._counters and many_writer._counters
    for metrics in (one_metrics, many_metrics):
        metrics.sync({}, {}, {}, 0, 0)
    assert _samples(many_metrics) == _samples(one_metrics)


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the children's creation times."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_each_request_line_is_stamped_with_its_own_end_not_the_batch_time() -> None:
    out = io.BytesIO()
    writer = tlog._QueuedBytesWriter(out)
    saved = tlog._writer, tlog._json, tlog._level
    tlog._writer, tlog._json, tlog._level = writer, True, 20
    try:
        first, second = _done(1), _done(2)
        first.ended_at, second.ended_at = 1_700_000_000.25, 1_700_000_001.5
        tlog.log_requests([first, second])
        writer.close()
    finally:
        tlog._writer, tlog._json, tlog._level = saved
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["r1", "r2"]
    assert [line["timestamp"] for line in lines] == [
        "2023-11-14T22:13:20.250000Z",
        "2023-11-14T22:13:21.500000Z",
    ]
    assert lines[0]["event"] == "request" and lines[0]["prompt_tokens"] == 101 and lines[0]["cost_usd"] > 0


def test_a_metrics_sync_folds_the_buffer_first() -> None:
    """A scrape (and the quarter-second sync that other workers read) sees every request that
    ended before it, however long until the next fold."""
    metrics = Metrics()
    app = web.Application()
    app[METRICS] = metrics
    app[DISPATCHER] = Dispatcher(UpstreamPool())
    book = app[BOOKKEEPING] = Bookkeeping((metrics.record_many,), interval_s=3600)
    book.add(_done(1))
    ops.sync_metrics(app)
    text = metrics.exposition().decode()
    assert 'switchyard_requests_total{deployment="priced",endpoint="/v1/chat/completions"' in text
    assert book.pending == 0
