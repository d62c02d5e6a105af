"""Operations endpoints: ``/healthz``, ``/readyz``, ``/metrics`` and the dashboard page,
and the set-up check a gateway runs once it starts.

Ready means the gateway can answer: a policy is loaded, Redis has answered at least once
since the start (a Redis that never answered is a wrong ``REDIS_URL``; one that goes away
later only costs stats, so it does not make the gateway unready), and every tier has a
deployment whose API key is set and, where it is replica-backed, a healthy replica (a
launch the preflight refused never gets one: its reason is shown). A deployment whose
``api_key_env`` is unset is listed under ``missing_keys`` either way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from gateway.config import PolicyHolder, PolicySnapshot
from gateway.http.responses import json_response
from gateway.http.state import (
    BOOKKEEPING,
    DASHBOARD_HTML,
    DISPATCHER,
    LIMITER,
    METRICS,
    POLICY,
    POOL,
    READINESS,
    REDIS,
    SETTINGS,
    STATS,
)
from gateway.policy import Policy
from gateway.replicas.status import readiness, replica_problems
from gateway.store import display_url
from gateway.telemetry import logging as tlog
from gateway.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

_log = structlog.get_logger("switchyard")
_REDIS_PING_S = 0.5


@dataclass(frozen=True, slots=True)
class MissingKey:
    """A deployment whose ``api_key_env`` names an unset (or empty) variable."""

    deployment: str
    env: str


def missing_keys(policy: Policy, environ: Mapping[str, str] | None = None) -> list[MissingKey]:
    """The deployments of ``policy`` whose API key variable is unset or empty."""
    environ = os.environ if environ is None else environ
    return [
        MissingKey(name, d.api_key_env)
        for name, d in policy.deployments.items()
        if d.api_key_env and not environ.get(d.api_key_env)
    ]


def keyless_tiers(policy: Policy, missing: list[MissingKey]) -> list[str]:
    """The tiers none of whose deployments has its API key: nothing in them can answer."""
    lacking = {m.deployment for m in missing}
    return [
        name
        for name, members in policy.tiers.items()
        if members and all(m.deployment in lacking for m in members)
    ]


def _key_problems(policy: Policy, missing: list[MissingKey]) -> list[str]:
    problems = []
    for tier in keyless_tiers(policy, missing):
        names = [m.deployment for m in policy.tiers[tier]]
        envs = sorted({m.env for m in missing if m.deployment in names})
        problems.append(
            f"tier {tier}: no deployment has its API key ({', '.join(names)}: "
            f"{', '.join(envs)} not set): set it in the gateway's environment and restart"
        )
    return problems


def _warn_missing_keys(snapshot: PolicySnapshot) -> None:
    by_env: dict[str, list[str]] = {}
    for item in missing_keys(snapshot.policy):
        by_env.setdefault(item.env, []).append(item.deployment)
    for env, names in by_env.items():
        _log.warning(
            "api_key_missing",
            env=env,
            deployments=names,
            message=f"{env} is not set, so {', '.join(names)} cannot answer: export {env}=... and "
            "restart the gateway (or remove those deployments from the policy)",
        )


def _redis_problem(url: str) -> str:
    return (
        f"cannot reach Redis at {display_url(url)} (REDIS_URL): start Redis there, fix REDIS_URL, "
        "or unset it to use an embedded Redis"
    )


async def _ping(app: web.Application) -> bool:
    try:
        async with asyncio.timeout(_REDIS_PING_S):
            await app[REDIS].ping()
    except Exception:
        return False
    app[READINESS].redis_reached = True
    return True


async def check_setup(app: web.Application) -> None:
    """Once, at start: one warning line for a Redis that does not answer and one for each
    deployment whose API key is not set (again after a reload that adds one)."""
    if not await _ping(app):
        url = app[SETTINGS].redis_url or ""
        _log.warning("redis_unreachable", url=display_url(url), message=_redis_problem(url))
    holder = app[POLICY]
    _warn_missing_keys(holder.current)
    holder.on_change(_warn_missing_keys)


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
        # Where it came from: the file, or the policy pushed to Redis for the whole fleet.
        "origin": "redis" if snap.source.startswith("redis:") else "file",
        "loaded_at": snap.loaded_at,
        "reload_error": None if error is None else [str(i) for i in error.issues],
        "deployments": list(snap.policy.deployments),
        "tiers": {name: [m.deployment for m in members] for name, members in snap.policy.tiers.items()},
    }


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 when ready, else 503 with ``problems`` saying what to fix (see
    the module docstring); shows the policy (and a failed reload), whether Redis answers,
    the deployments missing their API key, and the replica-backed deployments."""
    app = request.app
    redis_ok = await _ping(app)
    holder = app[POLICY]
    policy = holder.current.policy
    missing = missing_keys(policy)
    problems = _key_problems(policy, missing)
    if not app[READINESS].redis_reached:
        problems.insert(0, _redis_problem(app[SETTINGS].redis_url or ""))
    replicas = readiness(app[POOL], list(policy.deployments))
    # A policy without tiers (requests name deployments): its deployments as one group.
    groups = {t: [m.deployment for m in ms] for t, ms in policy.tiers.items()} or {
        "": list(policy.deployments)
    }
    problems += replica_problems(groups, replicas)
    body = {
        "status": "not_ready" if problems else "ready",
        "problems": problems,
        "policy": policy_status(holder),
        "redis": redis_ok,
        "missing_keys": {m.deployment: m.env for m in missing},
        "replicas": replicas,
        # Each deployment's circuit and its latest failure (a revoked key shows as "401").
        "circuits": app[DISPATCHER].breakers.status(),
    }
    return json_response(body, status=503 if problems else 200)


def sync_metrics(app: web.Application) -> None:
    """Fold the finished requests not yet folded, and copy the counters other stages keep
    as integers into the Prometheus metrics."""
    book = app.get(BOOKKEEPING)
    if book is not None:
        book.flush()
    dispatcher = app[DISPATCHER]
    stats, limiter = app.get(STATS), app.get(LIMITER)
    app[METRICS].sync(
        dispatcher.counters,
        dispatcher.breakers.transitions,
        dispatcher.breakers.status(),
        stats.dropped if stats is not None else 0,
        tlog.dropped_lines(),
        limiter.errors if limiter is not None else 0,
    )


async def sync_metrics_forever(app: web.Application, interval_s: float = 0.25) -> None:
    """:func:`sync_metrics` every ``interval_s``."""
    # Other workers answer scrapes too: each keeps its shared-memory figures at most
    # ``interval_s`` old.
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
