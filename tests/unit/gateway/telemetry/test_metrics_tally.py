"""Requests are tallied in process and reach the Prometheus metrics at each sync: the
histograms and counters then hold exactly what observing each request would have given."""

from __future__ import annotations

import copy
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.routing.resolve import Route
from gateway.telemetry.metrics import E2E_BUCKETS_S, ROUTE_SCORE_BUCKETS, Metrics
from gateway.telemetry.record import FinishedRequest, finished_request

from .test_record import _ctx


def _requests(n: int) -> list[FinishedRequest]:
    rng = random.Random(7)
    base = finished_request(_ctx("priced"))
    # Durations on bucket bounds (a bound holds its own value), between them, past the last.
    durations_s = [*E2E_BUCKETS_S, 0.0, 1e-9, 400.0, *(rng.uniform(0, 350) for _ in range(n))]
    done = []
    for i, seconds in enumerate(durations_s):
        request = copy.copy(base)
        request.e2e_ms = seconds * 1000.0
        request.prompt_tokens = rng.randint(1, 1000)  # one prompt_size: lt1k
        request.completion_tokens = i % 3  # 0: nothing to add
        score = ROUTE_SCORE_BUCKETS[i % len(ROUTE_SCORE_BUCKETS)] if i % 2 else rng.random()
        request.route = Route(tier="fast", deployments=("priced",), reason="score", score=score)
        done.append(request)
    return done


def _reference(values: list[float], buckets: tuple[float, ...]) -> list[tuple[str, float]]:
    """prometheus_client's own histogram of ``values``, observed one by one."""
    registry = CollectorRegistry()
    hist = Histogram("ref", "", buckets=buckets, registry=registry)
    for value in values:
        hist.observe(value)
    return [
        (sample.labels.get("le", sample.name), sample.value)
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    ]


def _same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    """The same samples: every bucket's count exact; the sum up to the order of its additions."""
    assert [name for name, _ in got] == [name for name, _ in want]
    assert [value for _, value in got] == pytest.approx([value for _, value in want], rel=1e-12)


def _samples(metrics: Metrics, name: str, **labels: str) -> list[tuple[str, float]]:
    return [
        (sample.labels.get("le", sample.name.replace(name, "ref")), sample.value)
        for metric in metrics.registry.collect()
        for sample in metric.samples
        if sample.name.startswith(name)
        and not sample.name.endswith("_created")
        and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def test_a_sync_adds_exactly_what_observing_each_request_would() -> None:
    metrics = Metrics()
    done = _requests(500)
    for request in done:
        metrics.record(request)
    metrics.sync({}, {}, {}, 0, 0)
    e2e = _samples(metrics, "switchyard_request_duration_seconds", deployment="priced")
    _same(e2e, _reference([r.e2e_ms / 1000.0 for r in done], E2E_BUCKETS_S))
    scores = _samples(metrics, "switchyard_route_score", tier="fast")
    _same(
        scores,
        _reference(
            [r.route.score for r in done if r.route and r.route.score is not None], ROUTE_SCORE_BUCKETS
        ),
    )
    value = metrics.registry.get_sample_value
    assert value("switchyard_requests_total", {"deployment": "priced", "status": "200"} | _rest()) == len(
        done
    )
    assert value("switchyard_prompt_tokens_total", {"deployment": "priced"}) == sum(
        r.prompt_tokens or 0 for r in done
    )
    assert value("switchyard_completion_tokens_total", {"deployment": "priced"}) == sum(
        r.completion_tokens or 0 for r in done
    )
    assert value("switchyard_cost_usd_total", {"deployment": "priced"}) == pytest.approx(
        sum(r.cost_nano_usd for r in done) / 1e9
    )
    assert value("switchyard_route_decisions_total", {"tier": "fast", "by": "score"}) == len(done)


def test_what_came_after_a_sync_waits_for_the_next_and_nothing_is_counted_twice() -> None:
    metrics = Metrics()
    first, second = _requests(20), _requests(30)
    for request in first:
        metrics.record(request)
    metrics.sync({}, {}, {}, 0, 0)
    before = generate_latest(metrics.registry)
    for request in second:
        metrics.record(request)
    assert generate_latest(metrics.registry) == before  # tallied, not yet added
    metrics.sync({}, {}, {}, 0, 0)
    metrics.sync({}, {}, {}, 0, 0)  # a sync with nothing new adds nothing
    e2e = _samples(metrics, "switchyard_request_duration_seconds", deployment="priced")
    _same(e2e, _reference([r.e2e_ms / 1000.0 for r in first + second], E2E_BUCKETS_S))


def _rest() -> dict[str, str]:
    return {"endpoint": "/v1/chat/completions", "tier": "fast", "error": ""}
