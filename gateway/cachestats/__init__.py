"""Cache-hit accounting in Redis: per deployment, key and template, in 1-minute buckets kept 48 h.

For each request two figures are counted: the provider's report
(``usage.prompt_tokens_details.cached_tokens``) and the gateway's expectation (the shaped
prompt's checkpoint chain looked up in Redis: :mod:`gateway.cachestats.prefix`). Counters go
through :class:`~gateway.store.writer.StatsWriter` (summed in process, written in one script
call, dropped and counted when Redis is slow); the expectations of all the requests of a 100
ms interval are looked up together, one script call per deployment in one round trip, off
the request path. The request's cost (:mod:`gateway.cachestats.cost`) is counted with them,
and per day in ``sy:cost:<YYYY-MM-DD>`` (kept 90 days) for ``/admin/costs``. Each template
also keeps its last requests' segment signatures, so a template that misses the cache can be
told which segment breaks it, and the last shaped requests say what shaping moved in them,
why and where to.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.cachestats.prefix import GEOMETRY, expect_shared
from gateway.policy import Policy
from gateway.store.fold import fold
from gateway.store.writer import StatsWriter

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

BUCKET_S = 60
RETENTION_S = 48 * 3600
SIGNATURES_KEPT = 20
MOVES_KEPT = 200
"""Shaped requests whose moves are kept (newest first) for ``switchyard stats``."""
MOVES_KEY = "sy:moves"
LOW_HIT_RATE = 0.30
METRICS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "expected_cached_tokens",
    "shaped_requests",
    "cost_nano_usd",
    "rc_hits",
    "rc_misses",
    "rc_stores",
    "rc_bypass",
    "rc_saved_tokens",
    "rc_saved_nano_usd",
)
"""The ``rc_*`` counters are the response cache's (:mod:`gateway.cache`): a hit counts
only there (no request went upstream, so none of its tokens is a provider's)."""
_RC_OUTCOMES = {"hit": "rc_hits", "miss": "rc_misses", "store": "rc_stores", "bypass": "rc_bypass"}
NO_KEY = "-"
COST_RETENTION_DAYS = 90
_TTL_S = RETENTION_S + BUCKET_S
_DAY_TTL_S = COST_RETENTION_DAYS * 86400
_DAY_METRICS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_nano_usd")


def window(since_s: int) -> range:
    """The Unix minutes of the last ``since_s`` seconds (at least the current one)."""
    now_min = int(time.time()) // BUCKET_S
    return range(now_min - max(1, since_s // BUCKET_S) + 1, now_min + 1)


def _bucket(minute: int) -> str:
    return f"sy:cs:{minute}"


def _day_key(day: str) -> str:
    return f"sy:cost:{day}"


def _day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def _signatures_key(template: str) -> str:
    return f"sy:sig:{{{template}}}"


class Accounting:
    """Writes a request's counters and its expectation; reads the reports."""

    def __init__(
        self,
        writer: StatsWriter,
        redis: Redis,
        max_pending_expectations: int = 20_000,
        interval_s: float = 0.1,
    ) -> None:
        self._writer = writer
        self._redis = redis
        self._slots = max_pending_expectations
        self._interval_s = interval_s
        self._pending: list[tuple[str, str, str, Sequence[int], float]] = []
        self.expectations_dropped = 0
        self._minute = -1
        self._keys = ("", "")  # this minute's bucket key and its day's cost key

    def _keys_at(self, ts: float) -> tuple[str, str]:
        """The minute bucket's key and the day's cost key of the time ``ts`` (built once a
        minute: a day starts on a minute, so the minute decides both)."""
        minute = int(ts) // BUCKET_S
        if minute != self._minute:
            self._minute = minute
            self._keys = (_bucket(minute), _day_key(_day(ts)))
        return self._keys

    def record_many(self, batch: Sequence[FinishedRequest]) -> None:
        """Queue a batch of requests' counters (a batch sink, :mod:`gateway.telemetry.bookkeeping`),
        each in the minute it ended."""
        record = self.record
        for done in batch:
            record(done)

    def record(self, done: FinishedRequest) -> None:
        """Queue this request's counters (never waits on Redis)."""
        if done.deployment is None:
            return
        # A vLLM deployment's tokens per prompt byte, for the next expectations.
        if done.cache != "hit":
            GEOMETRY.observe(done.deployment, done.prefix_chain, done.prompt_tokens)
        template = done.shape.template if done.shape is not None else done.cache_template or NO_KEY
        key, day_key = self._keys_at(done.ended_at)
        # This minute's counters of the deployment, key and template, and today's of the key
        # and deployment (the costs report).
        prefix = f"{done.deployment}|{done.key_id or NO_KEY}|{template}|"
        minute = self._writer.counters(key, prefix, _TTL_S)
        if done.cache is not None:
            outcome = _RC_OUTCOMES[done.cache]
            minute[outcome] = minute.get(outcome, 0) + 1
            if outcome == "rc_hits":
                saved = (done.prompt_tokens or 0) + (done.completion_tokens or 0)
                minute["rc_saved_tokens"] = minute.get("rc_saved_tokens", 0) + saved
                minute["rc_saved_nano_usd"] = minute.get("rc_saved_nano_usd", 0) + done.cache_saved_nano_usd
                return
        day = self._writer.counters(day_key, f"{done.key_id or NO_KEY}|{done.deployment}|", _DAY_TTL_S)
        minute["requests"] = minute.get("requests", 0) + 1
        if done.failed:
            minute["errors"] = minute.get("errors", 0) + 1
        day["requests"] = day.get("requests", 0) + 1
        for name, value in (
            ("prompt_tokens", done.prompt_tokens),
            ("completion_tokens", done.completion_tokens),
            ("cached_tokens", done.cached_tokens),
            ("cost_nano_usd", done.cost_nano_usd),
        ):
            if value:
                minute[name] = minute.get(name, 0) + value
                day[name] = day.get(name, 0) + value
        shape = done.shape
        if shape is None:
            return
        if shape.moved or shape.tools_sorted or shape.rag_moved:
            minute["shaped_requests"] = minute.get("shaped_requests", 0) + 1
        if shape.moves:
            moved = orjson.dumps(
                {
                    "request_id": done.request_id,
                    "ts": int(done.ended_at),
                    "deployment": done.deployment,
                    "template": template,
                    "moves": shape.moves,
                }
            )
            self._writer.push(MOVES_KEY, moved, MOVES_KEPT, RETENTION_S)
        if shape.segments and template != NO_KEY:
            signature = orjson.dumps(shape.segments)
            self._writer.push(_signatures_key(template), signature, SIGNATURES_KEPT, RETENTION_S)
        if done.prefix_chain and done.status < 400:
            if len(self._pending) >= self._slots:
                self.expectations_dropped += 1
                return
            self._pending.append((key, prefix, done.deployment, done.prefix_chain, done.cache_ttl_s))

    async def expect(self) -> None:
        """Look the waiting requests' prefixes up in Redis, all in one round trip."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            async with asyncio.timeout(0.5):
                expected = await expect_shared(
                    self._redis, [(d, chain, ttl) for _, _, d, chain, ttl in batch]
                )
        except (RedisError, OSError, TimeoutError):
            self.expectations_dropped += len(batch)
            return
        for (key, prefix, _, _, _), tokens in zip(batch, expected, strict=True):
            if tokens:
                minute = self._writer.counters(key, prefix, _TTL_S)
                minute["expected_cached_tokens"] = minute.get("expected_cached_tokens", 0) + tokens

    async def run(self) -> None:
        """Resolve expectations every ``interval_s`` until cancelled; a last batch on the way out."""
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                await self.expect()
        finally:
            await self.expect()

    async def report(self, policy: Policy, since_s: int) -> dict[str, Any]:
        """Totals over the last ``since_s`` seconds per deployment, key and template, with
        hit rates, the expected rate, the saving in USD, and for each template under 30 %
        the first segment where its requests diverge."""
        found, _ = await self.window_report(policy, since_s, window(since_s))
        return found

    async def window_report(
        self, policy: Policy, since_s: int, minutes: range, point_of: Callable[[int], int] | None = None
    ) -> tuple[dict[str, Any], dict[int, dict[str, int]]]:
        """:meth:`report` over ``minutes`` (the last ``since_s`` seconds), and with
        ``point_of`` (a Unix minute's point of the dashboard's cache charts) every counter
        summed over all deployments, keys and templates per point: one read of the minutes."""
        keys = [_bucket(m) for m in minutes]
        if point_of is None:
            sums, by_point = await fold(self._redis, keys)
        else:
            sums, by_point = await fold(self._redis, keys, [point_of(m) for m in minutes], "last")
        rows: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
        for name, value in sums.items():
            deployment, key, template, metric = name.rsplit("|", 3)
            if metric in METRICS:
                rows[deployment, key, template][metric] += value
        by_deployment: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
        by_key: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
        by_template: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
        saved: dict[tuple[str, str, str], float] = {}
        for (deployment, key, template), counts in rows.items():
            saved[deployment, key, template] = _saving(policy, deployment, counts["cached_tokens"])
            for target, name in ((by_deployment, deployment), (by_key, key), (by_template, template)):
                for metric, value in counts.items():
                    target[name][metric] += value
        saved_by: dict[str, defaultdict[str, float]] = {
            "deployment": defaultdict(float),
            "key": defaultdict(float),
            "template": defaultdict(float),
        }
        for (deployment, key, template), usd in saved.items():
            saved_by["deployment"][deployment] += usd
            saved_by["key"][key] += usd
            saved_by["template"][template] += usd
        deployments_of: dict[str, set[str]] = defaultdict(set)
        for deployment, _, template in rows:
            deployments_of[template].add(deployment)
        templates = []
        for template, counts in sorted(by_template.items(), key=lambda kv: -kv[1]["prompt_tokens"]):
            entry = {
                "template": template,
                **_rates(counts),
                "saved_usd": round(saved_by["template"][template], 6),
            }
            entry["deployments"] = sorted(deployments_of[template])
            entry["flagged"] = (
                template != NO_KEY and counts["requests"] >= 3 and entry["hit_rate"] < LOW_HIT_RATE
            )
            entry["breaking_segment"] = await self._divergence(template) if entry["flagged"] else None
            templates.append(entry)
        oldest = int(time.time()) - since_s
        moved = [
            m for m in map(orjson.loads, await self._redis.lrange(MOVES_KEY, 0, -1)) if m["ts"] >= oldest
        ]
        totals: dict[str, int] = dict.fromkeys(METRICS, 0)
        for counts in rows.values():
            for metric, value in counts.items():
                totals[metric] += value
        point_totals = {point: {m: found.get(m, 0) for m in METRICS} for point, found in by_point.items()}
        return {
            "since_s": since_s,
            "totals": {**_rates(totals), "saved_usd": round(sum(saved.values()), 6)},
            "deployments": {
                d: {**_rates(c), "saved_usd": round(saved_by["deployment"][d], 6)}
                for d, c in by_deployment.items()
            },
            "keys": {k: {**_rates(c), "saved_usd": round(saved_by["key"][k], 6)} for k, c in by_key.items()},
            "templates": templates,
            "moved": moved,
            "stats_writes": {
                "written": self._writer.written,
                "dropped": self._writer.dropped,
                "pending": self._writer.pending,
                "expectations_dropped": self.expectations_dropped,
            },
        }, point_totals

    async def costs(self, days: int) -> dict[str, Any]:
        """Requests, tokens and USD per UTC day (newest first), each split by key and by deployment."""
        now = time.time()
        names = [_day(now - i * 86400) for i in range(days)]
        # Each day's hash read through the script (one JSON string per call), not as HGETALL
        # replies that redis-py parses field by field.
        _, by_day = await fold(self._redis, [_day_key(n) for n in names], range(days), "whole", total=False)
        out = []
        for i, name in enumerate(names):
            total: dict[str, int] = dict.fromkeys(_DAY_METRICS, 0)
            by_key: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_DAY_METRICS, 0))
            by_deployment: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_DAY_METRICS, 0))
            for field, value in by_day.get(i, {}).items():
                key, deployment, metric = field.rsplit("|", 2)
                if metric not in total:
                    continue
                total[metric] += value
                by_key[key][metric] += value
                by_deployment[deployment][metric] += value
            out.append(
                {
                    "day": name,
                    **_usd(total),
                    "keys": {k: _usd(v) for k, v in sorted(by_key.items())},
                    "deployments": {d: _usd(v) for d, v in sorted(by_deployment.items())},
                }
            )
        return {"object": "list", "days": out}

    async def _divergence(self, template: str) -> dict[str, Any] | None:
        raw = await self._redis.lrange(_signatures_key(template), 0, SIGNATURES_KEPT - 1)
        return first_divergence([orjson.loads(r) for r in raw])


def first_divergence(signatures: list[list[list[str]]]) -> dict[str, Any] | None:
    """The first segment position where these requests' prompts differ (the newest first)."""
    if len(signatures) < 2:
        return None
    for i in range(max(len(s) for s in signatures)):
        seen = {tuple(s[i][:2]) if i < len(s) else ("(missing)", "") for s in signatures}
        if len(seen) > 1:
            newest = signatures[0][i] if i < len(signatures[0]) else ["(missing)", "", ""]
            return {"index": i, "segment": newest[0], "preview": newest[2], "variants": len(seen)}
    return None


def _saving(policy: Policy, deployment: str, cached_tokens: int) -> float:
    found = policy.deployments.get(deployment)
    price = found.price if found is not None else None
    if price is None or not cached_tokens:
        return 0.0
    cached_price = price.cached_input if price.cached_input is not None else price.input
    return cached_tokens * (price.input - cached_price) / 1e6


def _usd(counts: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in counts.items() if not k.endswith("nano_usd")}
    out["cost_usd"] = round(counts["cost_nano_usd"] / 1e9, 9)
    if "rc_saved_nano_usd" in counts:
        out["rc_saved_usd"] = round(counts["rc_saved_nano_usd"] / 1e9, 9)
    return out


def response_cache_rate(counts: dict[str, int]) -> float:
    """The response cache's hit rate: hits over the lookups (hits, misses and stores)."""
    lookups = counts.get("rc_hits", 0) + counts.get("rc_misses", 0) + counts.get("rc_stores", 0)
    return round(counts.get("rc_hits", 0) / lookups, 4) if lookups else 0.0


def _rates(counts: dict[str, int]) -> dict[str, Any]:
    prompt = counts["prompt_tokens"]
    return {
        **_usd(counts),
        "hit_rate": round(counts["cached_tokens"] / prompt, 4) if prompt else 0.0,
        "expected_hit_rate": round(counts["expected_cached_tokens"] / prompt, 4) if prompt else 0.0,
        "rc_hit_rate": response_cache_rate(counts),
    }
