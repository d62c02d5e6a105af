"""The admin API, an aiohttp sub-app mounted at ``/admin``: policy and reload, cache and
dashboard reports, replicas, dispatch state, virtual keys and costs.

Its own middleware checks the admin key before any handler runs, so no handler can forget
it, and turns a Redis that does not answer into 503 ``redis_unavailable`` (keys, costs)
for every handler at once. Handlers read the gateway's state through
``request.config_dict`` (the sub-app's own state is empty; the main app's is behind it).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError

from gateway import cachestats
from gateway.auth.bearer import bearer_token
from gateway.auth.keys import validate_new_key
from gateway.config import is_loopback
from gateway.errors import InvalidRequestError, NotFoundError, PermissionDeniedError, RedisUnavailableError
from gateway.http.middleware import Handler
from gateway.http.ops import policy_status
from gateway.http.redact import redacted_policy
from gateway.http.responses import json_response, read_json
from gateway.http.state import (
    ACCOUNTING,
    BOOKKEEPING,
    DASHBOARD,
    DISPATCHER,
    DRIFT,
    FLEET,
    KEYS,
    LIMITER,
    POLICY,
    POOL,
    REDIS,
    SETTINGS,
    SHADOW,
    SUPERVISOR,
)
from gateway.policy import Policy
from gateway.replicas.status import replica_status
from gateway.store.fleet import fleet_report
from gateway.store.gate import REDIS_FAULTS
from gateway.validation import parse_duration

Report = Callable[[Policy, int], Awaitable[dict[str, Any]]]


@web.middleware
async def admin_key_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Admin endpoints need ``Authorization: Bearer $SWITCHYARD_ADMIN_KEY``; without an admin
    key configured they are open only on a gateway bound to loopback. A Redis error in any
    handler is 503 ``redis_unavailable``."""
    # An unknown path or a wrong method keeps the router's 404/405, as on the main app.
    if request.match_info.http_exception is None:
        _require_admin_key(request)
    try:
        return await handler(request)
    except RedisError as exc:
        # The client's own socket timeout (about a second) bounds each command here.
        raise RedisUnavailableError(
            f"The gateway's Redis did not answer ({type(exc).__name__}); "
            "keys and costs cannot be read or changed until it does. Retry shortly."
        ) from None


def _require_admin_key(request: web.Request) -> None:
    settings = request.config_dict[SETTINGS]
    if settings.admin_key is None:
        if is_loopback(settings.host):
            return
        raise PermissionDeniedError("Admin API is disabled: set SWITCHYARD_ADMIN_KEY.")
    token = bearer_token(request.headers.get("Authorization")) or ""
    given = token.encode("utf-8", "surrogateescape")  # a header's bytes, as sent
    if not hmac.compare_digest(given, settings.admin_key.encode("utf-8", "surrogateescape")):
        raise PermissionDeniedError("Admin API needs the admin key.", code="invalid_admin_key")


async def admin_policy(request: web.Request) -> web.Response:
    """``GET /admin/policy``: the loaded policy (secrets redacted) and its status."""
    holder = request.config_dict[POLICY]
    body = {**policy_status(holder), "policy": redacted_policy(holder.current)}
    return json_response(body)


async def admin_reload(request: web.Request) -> web.Response:
    """``POST /admin/reload``: read the policy file again (422 with the issues when it fails)."""
    holder = request.config_dict[POLICY]
    swapped = holder.reload()
    status = 200 if holder.reload_error is None else 422
    body = {"reloaded": swapped, **policy_status(holder)}
    return json_response(body, status)


def _since_s(request: web.Request) -> int:
    raw = request.query.get("since", "1h")
    try:
        value = float(parse_duration(raw))
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param="since") from None
    return max(60, min(int(value), cachestats.RETENTION_S))


async def _redis_report(request: web.Request, report: Report) -> web.Response:
    """An admin report read from Redis over ``?since=``; 503 when Redis does not answer."""
    since = _since_s(request)
    policy = request.config_dict[POLICY].current.policy
    _fold_finished(request)
    try:
        async with asyncio.timeout(3.0):
            body = await report(policy, since)
    except REDIS_FAULTS as exc:
        raise RedisUnavailableError(
            f"stats are unavailable: Redis did not answer ({type(exc).__name__})", code="stats_unavailable"
        ) from None
    return json_response(body)


def _fold_finished(request: web.Request) -> None:
    """The finished requests not yet folded, into the stats writer's counters: a report
    just after a request is then as late as the writer's next flush, as it always was."""
    book = request.config_dict.get(BOOKKEEPING)
    if book is not None:
        book.flush()


async def admin_stats(request: web.Request) -> web.Response:
    """``GET /admin/stats``: the cache-hit report per deployment, key and template."""
    return await _redis_report(request, request.config_dict[ACCOUNTING].report)


async def admin_dashboard(request: web.Request) -> web.Response:
    """What ``GET /dashboard`` shows: latency, mix, errors, retries, cost, cache, per key from
    Redis, under ``live`` this process's view of each deployment now, and under ``routing``
    its classifier's live strong share against the calibrated target."""
    config = request.config_dict
    report = config[DASHBOARD].report

    async def with_live(policy: Policy, since_s: int) -> dict[str, Any]:
        body = await report(policy, since_s)
        body["live"] = live_deployments(config, list(policy.deployments))
        body["routing"] = config[DRIFT].summary()
        body["fleet"] = await fleet_report(config[REDIS])
        return body

    return await _redis_report(request, with_live)


def live_deployments(config: Mapping[Any, Any], deployments: list[str]) -> dict[str, dict[str, Any]]:
    """Per deployment: ``circuit`` (closed, half_open, open) and ``last_failure`` (a reason or
    status, e.g. ``"401"`` for a revoked key); for vLLM replica sets also what the replicas'
    /metrics report: healthy replicas, prefix-cache hit rate (tokens, since start), requests
    running and waiting, the fullest KV cache and the mean TTFT. ``None`` where there is none."""
    circuits = config[DISPATCHER].breakers.status()
    replicas = replica_status(config[POOL], deployments, config[SUPERVISOR])["deployments"]
    out: dict[str, dict[str, Any]] = {}
    for name in deployments:
        circuit = circuits.get(name, {})
        out[name] = {
            "circuit": circuit.get("state", "closed"),
            "last_failure": circuit.get("last_failure"),
            **_replica_figures(replicas.get(name)),
        }
    return out


def _replica_figures(status: dict[str, Any] | None) -> dict[str, Any]:
    reps = status["replicas"] if status else []
    figures = [r["metrics"] for r in reps if r.get("metrics")]

    def total(key: str) -> float | None:
        values = [f[key] for f in figures if f.get(key) is not None]
        return sum(values) if values else None

    queries, hits = total("prefix_cache_queries_tokens"), total("prefix_cache_hits_tokens")
    kv = [f["kv_cache_usage"] for f in figures if f.get("kv_cache_usage") is not None]
    ttft = [f["ttft_mean_s"] for f in figures if f.get("ttft_mean_s") is not None]
    return {
        "healthy_replicas": sum(1 for r in reps if r.get("healthy")) if status else None,
        "prefix_cache_hit_rate": (hits or 0.0) / queries if queries else None,
        "running": total("running"),
        "waiting": total("waiting"),
        "kv_cache_usage": max(kv) if kv else None,
        "ttft_mean_ms": 1000 * sum(ttft) / len(ttft) if ttft else None,
    }


async def admin_fleet(request: web.Request) -> web.Response:
    """``GET /admin/fleet``: the gateways sharing this Redis, from their heartbeats (host,
    address, version, policy digest, uptime, in flight, last error), ``self`` naming this one."""
    config = request.config_dict
    try:
        async with asyncio.timeout(3.0):
            body = await fleet_report(config[REDIS])
    except REDIS_FAULTS as exc:
        raise RedisUnavailableError(
            f"the fleet is unavailable: Redis did not answer ({type(exc).__name__})", code="fleet_unavailable"
        ) from None
    return json_response({"self": config[FLEET].id, **body})


async def admin_replicas(request: web.Request) -> web.Response:
    """Replica-backed deployments: readiness, routing counts and the figures scraped from vLLM."""
    config = request.config_dict
    deployments = list(config[POLICY].current.policy.deployments)
    return json_response(replica_status(config[POOL], deployments, config[SUPERVISOR]))


async def admin_dispatch(request: web.Request) -> web.Response:
    """Circuit states per deployment, retry/hedge/fallback counters and the budgets."""
    return json_response(request.config_dict[DISPATCHER].status())


async def admin_routing_drift(request: web.Request) -> web.Response:
    """``GET /admin/routing/drift``: the classifier's live strong share against the calibrated
    target, the score distribution, and the shadow sample's counters (this process's)."""
    config = request.config_dict
    shadow = config[SHADOW]
    body = config[DRIFT].report()
    body["shadow"] = {**shadow.counters, "in_flight": shadow.in_flight}
    return json_response(body)


async def admin_create_key(request: web.Request) -> web.Response:
    """``POST /admin/keys``: a new virtual key; the secret is in this answer only."""
    body = await read_json(request)
    name, rpm, tpm, budget, models = validate_new_key(
        body.get("name"), body.get("rpm"), body.get("tpm"), body.get("budget_usd"), body.get("models")
    )
    keys = request.config_dict[KEYS]
    secret, record = await keys.create(name, rpm=rpm, tpm=tpm, budget_usd=budget, models=models)
    return json_response({"key": secret, **record.public()}, 201)


async def admin_list_keys(request: web.Request) -> web.Response:
    """``GET /admin/keys``: every key with its limits and spend, never a secret or hash."""
    records = await request.config_dict[KEYS].list()
    spend = await request.config_dict[LIMITER].spend_usd([r.key_id for r in records])
    data = [{**r.public(), "spend_usd": round(spend[r.key_id], 9)} for r in records]
    return json_response({"object": "list", "data": data})


async def admin_revoke_key(request: web.Request) -> web.Response:
    """``DELETE /admin/keys/{id}``: revoke a key (its record stays for the spend history)."""
    key_id = request.match_info["key_id"]
    record = await request.config_dict[KEYS].revoke(key_id)
    if record is None:
        raise NotFoundError(f"No key with id '{key_id}'.", code="key_not_found")
    return json_response(record.public())


async def admin_costs(request: web.Request) -> web.Response:
    """``GET /admin/costs?days=7``: spend per day, per key and per deployment."""
    raw = request.query.get("days", "7")
    if not raw.isdigit() or not 1 <= int(raw) <= cachestats.COST_RETENTION_DAYS:
        raise InvalidRequestError(
            f"'days' must be a whole number from 1 to {cachestats.COST_RETENTION_DAYS}.", param="days"
        )
    _fold_finished(request)
    return json_response(await request.config_dict[ACCOUNTING].costs(int(raw)))


def admin_app() -> web.Application:
    """The admin sub-app, to mount at ``/admin``."""
    admin = web.Application(middlewares=[admin_key_middleware])
    admin.router.add_get("/policy", admin_policy)
    admin.router.add_post("/reload", admin_reload)
    admin.router.add_get("/stats", admin_stats)
    admin.router.add_get("/dashboard", admin_dashboard)
    admin.router.add_get("/replicas", admin_replicas)
    admin.router.add_get("/fleet", admin_fleet)
    admin.router.add_get("/dispatch", admin_dispatch)
    admin.router.add_get("/routing/drift", admin_routing_drift)
    admin.router.add_post("/keys", admin_create_key)
    admin.router.add_get("/keys", admin_list_keys)
    admin.router.add_delete("/keys/{key_id}", admin_revoke_key)
    admin.router.add_get("/costs", admin_costs)
    return admin
