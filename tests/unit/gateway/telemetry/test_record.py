"""The finished-request record: priced once, by the one cost formula, and every sink reports
that same figure."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.cachestats import Accounting
from gateway.cachestats.cost import cost_nano_usd
from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.dashboard import DashboardStats
from gateway.store.writer import StatsWriter
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import finished_request

POLICY = parse_policy(
    """
deployments:
  priced: {base_url: "http://x", price: {input: 2.0, cached_input: 0.5, output: 8.0}}
  free: {base_url: "http://x"}
tiers: {fast: [priced]}
""",
    "p",
)
SNAPSHOT = PolicySnapshot(policy=POLICY, source="p", digest="d", version=1)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 800}}


def _ctx(deployment: str | None, usage: dict[str, Any] | None = USAGE) -> RequestContext:
    ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=SNAPSHOT)
    ctx.deployment, ctx.tier, ctx.status, ctx.usage = deployment, "fast", 200, usage
    ctx.finished_at = time.perf_counter()
    return ctx


def test_the_record_prices_the_request_with_the_one_cost_formula() -> None:
    done = finished_request(_ctx("priced"))
    assert done.cost_nano_usd == cost_nano_usd(POLICY.deployments["priced"].price, USAGE)
    assert done.cost_nano_usd == round((200 * 2.0 + 800 * 0.5 + 100 * 8.0) / 1e6 * 1e9)
    assert (done.prompt_tokens, done.cached_tokens, done.completion_tokens) == (1000, 800, 100)


def test_an_unpriced_or_unanswered_request_costs_nothing_and_has_no_tokens() -> None:
    assert finished_request(_ctx("free")).cost_nano_usd == 0
    done = finished_request(_ctx(None, usage=None))
    assert done.cost_nano_usd == 0 and done.prompt_tokens is None and done.cached_tokens is None


def test_odd_usage_is_cleaned_the_same_way_for_every_sink() -> None:
    odd = {"prompt_tokens": 10, "completion_tokens": -5, "prompt_tokens_details": {"cached_tokens": 99}}
    done = finished_request(_ctx("priced", usage=odd))
    # Cached tokens are capped at the prompt, a negative count is no count.
    assert done.cost_nano_usd == round(10 * 0.5 / 1e6 * 1e9)


def test_metrics_and_dashboard_report_the_records_cost() -> None:
    done = finished_request(_ctx("priced"))
    metrics = Metrics()
    metrics.record(done)
    metrics.sync({}, {}, {}, 0, 0)  # tallied, added at the next sync (each scrape starts with one)
    counted = metrics.registry.get_sample_value("switchyard_cost_usd_total", {"deployment": "priced"})
    assert counted == pytest.approx(done.cost_nano_usd / 1e9)
    writer = _Counting()
    DashboardStats(writer, None, Accounting(writer, None)).record(done)  # type: ignore[arg-type]
    Accounting(writer, None).record(done)  # type: ignore[arg-type]
    costs = [amount for field, amount in writer.added if field.endswith(("|cost_nusd", "|cost_nano_usd"))]
    # The dashboard's minute, the cache stats' minute and the cost per day.
    assert len(costs) == 3 and set(costs) == {done.cost_nano_usd}


class _Counting(StatsWriter):
    """A stats writer that remembers what it was asked to add (no Redis)."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._kept: list[tuple[str, dict[str, int]]] = []

    def counters(self, key: str, prefix: str, ttl_s: int) -> dict[str, int]:
        found = super().counters(key, prefix, ttl_s)
        if all(kept is not found for _, kept in self._kept):
            self._kept.append((prefix, found))
        return found

    @property
    def added(self) -> list[tuple[str, int]]:
        return [(prefix + name, amount) for prefix, kept in self._kept for name, amount in kept.items()]
