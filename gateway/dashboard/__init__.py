"""The built-in dashboard: latency, routing mix, errors, retries and cost per deployment and
per key, kept in Redis so every worker and replica reports the same figures.

Each finished request adds to counters summed in process by the stats writer (no Redis
round trip on the request path; dropped and counted when Redis is slow): its request,
error, retry, hedge and fallback counts, its tier, its cost, and one log-spaced histogram
bucket for each of TTFT, inter-token latency and end-to-end time, per (deployment, key),
in 1-minute buckets kept 48 h (the cache-stats retention). ``GET /admin/dashboard`` reads
a window of them, summed in Redis (:mod:`gateway.store.fold`); percentiles come from the
buckets (each 10 % wide, so a percentile is within ±5 % of the exact one), and folds the
minutes into time series for the charts.
``GET /dashboard`` is a static page that polls that API and draws them.

A request that never reached a deployment (a 400, an unknown model or path, a 401, a
key's 429) is counted too, under the deployment name ``(none)``: in the totals, its key's
rows and the errors by code, not in the deployments' table, so a storm of refused
requests shows on the page as it does on ``/metrics``.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from gateway.auth.bearer import bearer_token
from gateway.cachestats import BUCKET_S, NO_KEY, RETENTION_S, Accounting, window
from gateway.dashboard.histogram import LATENCIES, bucket_of, bucket_value_ms, percentile_ms
from gateway.dashboard.series import NO_DEPLOYMENT, SeriesBuilder
from gateway.policy import Policy
from gateway.store.fold import fold
from gateway.store.writer import StatsWriter

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

PAGE = Path(__file__).with_name("static") / "index.html"
_NANO = 1e9
__all__ = [
    "LATENCIES",
    "NO_DEPLOYMENT",
    "PAGE",
    "DashboardStats",
    "bucket_of",
    "bucket_value_ms",
    "key_label",
    "percentile_ms",
]
MAX_KEYS = 4096
_ERROR_CODE_CHARS = 48
OTHER_KEYS = "key_other"
_labels: dict[str, str] = {}


def key_label(authorization: str | None) -> str | None:
    """A stable, non-reversible name for the client's bearer key (``key_`` + 8 hex digits),
    so the dashboard can tell keys apart without storing them. A process names at most
    ``MAX_KEYS`` keys; later new ones are all ``key_other`` (bounded memory and Redis fields,
    whatever keys clients send)."""
    if not authorization:
        return None
    found = _labels.get(authorization)
    if found is not None:
        return found
    token = bearer_token(authorization)
    if token is None:
        return None
    if len(_labels) >= MAX_KEYS:
        return OTHER_KEYS
    # A header's bytes that are not UTF-8 read as lone surrogates: hashed as the bytes sent.
    label = "key_" + hashlib.blake2b(token.encode("utf-8", "surrogateescape"), digest_size=4).hexdigest()
    _labels[authorization] = label
    return label


def _minute_key(minute: int) -> str:
    return f"sy:dash:{minute}"


def _empty() -> dict[str, Any]:
    return {
        "requests": 0,
        "errors": 0,
        "retries": 0,
        "hedges": 0,
        "fallbacks": 0,
        "cost_nusd": 0,
        "by_code": defaultdict(int),
        "hist": {name: defaultdict(int) for name in LATENCIES},
    }


def _merge(into: dict[str, Any], counts: dict[str, Any]) -> None:
    for name in ("requests", "errors", "retries", "hedges", "fallbacks", "cost_nusd"):
        into[name] += counts[name]
    for code, n in counts["by_code"].items():
        into["by_code"][code] += n
    for name in LATENCIES:
        for index, n in counts["hist"][name].items():
            into["hist"][name][index] += n


def _summary(counts: dict[str, Any]) -> dict[str, Any]:
    requests = counts["requests"]
    out: dict[str, Any] = {
        "requests": requests,
        "errors": counts["errors"],
        "error_rate": round(counts["errors"] / requests, 4) if requests else 0.0,
        "retries": counts["retries"],
        "retry_rate": round(counts["retries"] / requests, 4) if requests else 0.0,
        "hedges": counts["hedges"],
        "fallbacks": counts["fallbacks"],
        "cost_usd": round(counts["cost_nusd"] / _NANO, 6),
        "errors_by_code": dict(sorted(counts["by_code"].items())),
    }
    for name in LATENCIES:
        hist = counts["hist"][name]
        out[f"{name}_ms"] = {
            "count": sum(hist.values()),
            "p50": percentile_ms(hist, 0.50),
            "p95": percentile_ms(hist, 0.95),
        }
    return out


class DashboardStats:
    """Records each finished request's dashboard counters; reads a window of them."""

    def __init__(self, writer: StatsWriter, redis: Redis, accounting: Accounting) -> None:
        self._writer = writer
        self._redis = redis
        self._accounting = accounting

    def record(self, done: FinishedRequest) -> None:
        """Queue this request's counters (summed in process; never waits on Redis)."""
        self.record_many((done,))

    def record_many(self, batch: Sequence[FinishedRequest]) -> None:
        """Queue a batch of requests' counters (a batch sink, :mod:`gateway.telemetry.bookkeeping`),
        each in the minute it ended."""
        # A batch's requests share a few (minute, deployment, key) rows: each row's counters
        # are looked up once, not once per request.
        rows: dict[tuple[int, str | None, str | None], dict[str, int]] = {}
        counters = self._writer.counters
        for done in batch:
            minute = int(done.ended_at) // BUCKET_S
            row = (minute, done.deployment, done.key_id)
            c = rows.get(row)
            if c is None:
                deployment = done.deployment or NO_DEPLOYMENT
                prefix = f"{deployment}|{done.key_id or NO_KEY}|"
                c = rows[row] = counters(_minute_key(minute), prefix, RETENTION_S + BUCKET_S)
            _count(c, done)

    async def report(self, policy: Policy, since_s: int) -> dict[str, Any]:
        """Everything the page shows, over the last ``since_s`` seconds."""
        minutes = window(since_s)
        series = SeriesBuilder(minutes, BUCKET_S)
        # Summed in Redis: over the window per field, and per point of the series per
        # deployment and metric (gateway.store.fold).
        keys = [_minute_key(m) for m in minutes]
        sums, by_point = await fold(self._redis, keys, [series.point_of(m) for m in minutes], "first_last")
        for point, groups in by_point.items():
            for group, value in groups.items():
                deployment, metric = group.split("|", 1)
                series.add(point, deployment, metric, value)
        rows: dict[tuple[str, str], dict[str, Any]] = defaultdict(_empty)
        tiers: dict[str, int] = defaultdict(int)
        for name, value in sums.items():
            deployment, key, metric = name.split("|", 2)
            row = rows[deployment, key]
            if metric.startswith("h:"):
                _, latency, index = metric.split(":")
                row["hist"][latency][int(index)] += value
            elif metric.startswith("tier:"):
                tiers[metric[5:]] += value
            elif metric.startswith("err:"):
                row["by_code"][metric[4:]] += value
            elif metric in row:
                row[metric] += value
        by_deployment: dict[str, dict[str, Any]] = defaultdict(_empty)
        by_key: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        totals = _empty()
        for (deployment, key), counts in rows.items():
            if deployment != NO_DEPLOYMENT:
                _merge(by_deployment[deployment], counts)
            _merge(totals, counts)
            by_key[key][deployment] = _summary(counts)
        routed = sum(tiers.values())
        cache, cache_points = await self._accounting.window_report(policy, since_s, minutes, series.point_of)
        for point, cache_totals in cache_points.items():
            series.add_cache(point, cache_totals)
        return {
            "since_s": since_s,
            "generated_at": time.time(),
            "totals": _summary(totals),
            "deployments": {name: _summary(counts) for name, counts in sorted(by_deployment.items())},
            "tiers": {
                tier: {"requests": n, "share": round(n / routed, 4) if routed else 0.0}
                for tier, n in sorted(tiers.items())
            },
            "keys": {key: dict(sorted(models.items())) for key, models in sorted(by_key.items())},
            "cache": {
                "totals": {
                    k: cache["totals"][k]
                    for k in ("prompt_tokens", "cached_tokens", "hit_rate", "expected_hit_rate", "saved_usd")
                },
                "templates": [
                    {
                        k: t[k]
                        for k in (
                            "template",
                            "requests",
                            "prompt_tokens",
                            "cached_tokens",
                            "hit_rate",
                            "expected_hit_rate",
                            "flagged",
                            "breaking_segment",
                        )
                    }
                    for t in cache["templates"]
                ],
            },
            "response_cache": {
                k: cache["totals"][k]
                for k in (
                    "rc_hits",
                    "rc_misses",
                    "rc_stores",
                    "rc_hit_rate",
                    "rc_saved_tokens",
                    "rc_saved_usd",
                )
            },
            "series": series.result(),
        }


def _count(c: dict[str, int], done: FinishedRequest) -> None:
    """Add one request to its row's counters."""
    c["requests"] = c.get("requests", 0) + 1
    if done.failed:
        c["errors"] = c.get("errors", 0) + 1
        name = "err:" + _error_code(done)
        c[name] = c.get(name, 0) + 1
    if done.retries:
        c["retries"] = c.get("retries", 0) + done.retries
    if done.hedged:
        c["hedges"] = c.get("hedges", 0) + 1
    if done.fallback_tier is not None:
        c["fallbacks"] = c.get("fallbacks", 0) + 1
    if done.tier is not None:
        name = "tier:" + done.tier
        c[name] = c.get(name, 0) + 1
    if done.cost_nano_usd:
        c["cost_nusd"] = c.get("cost_nusd", 0) + done.cost_nano_usd
    if done.deployment is None:
        return  # refused at the door: its few milliseconds say nothing of any upstream's latency
    if done.cache == "hit":
        return  # answered from Redis: not the deployment's latency
    name = f"h:e2e:{bucket_of(done.e2e_ms)}"
    c[name] = c.get(name, 0) + 1
    if done.stream and done.ttft_ms is not None:
        name = f"h:ttft:{bucket_of(done.ttft_ms)}"
        c[name] = c.get(name, 0) + 1
        if done.itl_ms is not None:
            name = f"h:itl:{bucket_of(done.itl_ms)}"
            c[name] = c.get(name, 0) + 1


def _error_code(done: FinishedRequest) -> str:
    """The code a failed request is counted under (its error code, else ``http_<status>``),
    kept short and free of the field separators."""
    code = done.error_code or f"http_{done.status}"
    return code[:_ERROR_CODE_CHARS].replace("|", "_").replace("/", "_").replace(":", "_")
