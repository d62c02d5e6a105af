"""Operations endpoints: ``/healthz``, ``/readyz``, ``/metrics`` and the dashboard page."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp import web

from gateway.config import PolicyHolder
from gateway.http.responses import json_response
from gateway.http.state import DASHBOARD_HTML, DISPATCHER, METRICS, POLICY, POOL, REDIS, STATS
from gateway.replicas.status import readiness
from gateway.telemetry import logging as tlog
from gateway.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process is up."""
    return json_response({"status": "ok", "pid": os.getpid()})


def policy_status(holder: PolicyHolder) -> dict[str, Any]:
    """The loaded policy's source, version and names, and the last reload's error."""
    snap = holder.current
    error = holder.reload_error
    return {
        "source": snap.source,
        "version": snap.version,
        "digest": snap.digest,
        "loaded_at": snap.loaded_at,
        "reload_error": None if error is None else [str(i) for i in error.issues],
        "deployments": list(snap.policy.deployments),
        "tiers": {name: [m.deployment for m in members] for name, members in snap.policy.tiers.items()},
    }


async def readyz(request: web.Request) -> web.Response:
    """Ready when a policy is loaded; shows a failed reload and whether Redis answers
    (a Redis outage does not make the gateway unready: it keeps serving without stats)."""
    redis_ok = True
    try:
        async with asyncio.timeout(0.5):
            await request.app[REDIS].ping()
    except Exception:
        redis_ok = False
    holder = request.app[POLICY]
    body = {
        "status": "ready",
        "policy": policy_status(holder),
        "redis": redis_ok,
        "replicas": readiness(request.app[POOL], list(holder.current.policy.deployments)),
        # Each deployment's circuit and its latest failure (a revoked key shows as "401").
        "circuits": request.app[DISPATCHER].breakers.status(),
    }
    return json_response(body)


def sync_metrics(app: web.Application) -> None:
    """Copy the counters other stages keep as integers into the Prometheus metrics."""
    dispatcher = app[DISPATCHER]
    stats = app.get(STATS)
    app[METRICS].sync(
        dispatcher.counters,
        dispatcher.breakers.transitions,
        dispatcher.breakers.status(),
        stats.dropped if stats is not None else 0,
        tlog.dropped_lines(),
    )


async def sync_metrics_forever(app: web.Application, interval_s: float = 1.0) -> None:
    """:func:`sync_metrics` every ``interval_s``."""
    # Other workers answer scrapes too: each keeps its shared-memory figures at most a second old.
    while True:
        await asyncio.sleep(interval_s)
        sync_metrics(app)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text format (every worker's figures with ``--workers N``)."""
    sync_metrics(request.app)
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def root_redirect(request: web.Request) -> web.Response:
    """``GET /``: a browser pointed at the gateway lands on the dashboard."""
    return web.Response(status=302, headers={"Location": "/dashboard"})


async def dashboard_page(request: web.Request) -> web.Response:
    """``GET /dashboard``: the static page (its data comes from ``/admin/dashboard``)."""
    return web.Response(
        body=request.app[DASHBOARD_HTML],
        content_type="text/html",
        headers={"Cache-Control": "no-cache", "X-Frame-Options": "DENY"},
    )
