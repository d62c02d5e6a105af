"""The gateway application: the one place that builds the stages and wires them together.

Each resource with a lifetime has its own cleanup context, in dependency order, so a
failed start unwinds exactly what started and a stop closes them in reverse: the policy
watch and the background tasks first, then the cache expectations (their last batch goes
through the stats writer's last flush), the stats writer, the upstream pool, and Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from aiohttp import web

from gateway.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from gateway.auth.keys import KeyStore
from gateway.auth.limits import Limiter
from gateway.cache.service import ResponseCache
from gateway.cache.view import LocalView
from gateway.cachestats import Accounting
from gateway.config import PolicyHolder, PolicySnapshot, Settings
from gateway.dashboard import PAGE as DASHBOARD_PAGE
from gateway.dashboard import DashboardStats
from gateway.dispatch.dispatcher import Dispatcher
from gateway.http import messages_api, ops, proxy, responses_api
from gateway.http.admin import admin_app
from gateway.http.middleware import context_middleware
from gateway.http.serve import stop_task
from gateway.http.state import (
    ACCOUNTING,
    AUTH_MODE,
    BOOKKEEPING,
    DASHBOARD,
    DASHBOARD_HTML,
    DISPATCHER,
    DRAINING,
    DRIFT,
    FLEET,
    IN_FLIGHT,
    KEYS,
    LIMITER,
    METRICS,
    POLICY,
    POOL,
    READINESS,
    REDIS,
    RESPONSE_CACHE,
    SECRETS,
    SETTINGS,
    SHADOW,
    SHAPING,
    STAGES,
    STATS,
    SUPERVISOR,
    TRACING,
    Readiness,
)
from gateway.pipeline import Stages
from gateway.providers.pool import UpstreamPool
from gateway.replicas.status import LaunchSupervisor
from gateway.replicas.status import attach as attach_launches
from gateway.routing.drift import DriftMonitor
from gateway.routing.shadow import ShadowSampler
from gateway.shaping.service import ShapingState
from gateway.store import connect
from gateway.store.fleet import FleetMember
from gateway.store.gate import REDIS_FAULTS, RedisGate
from gateway.store.policy import follow as follow_policy
from gateway.store.policy import follow_once as follow_policy_once
from gateway.store.resp import fast_client
from gateway.store.writer import StatsWriter
from gateway.telemetry import logging as tlog
from gateway.telemetry import tracing
from gateway.telemetry.bookkeeping import Bookkeeping
from gateway.telemetry.metrics import Metrics


@contextlib.asynccontextmanager
async def _running(coro: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """A background task for the duration of the block; cancelled and awaited at its end."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield
    finally:
        await stop_task(task)


async def _redis(app: web.Application) -> AsyncIterator[None]:
    redis_url = app[SETTINGS].redis_url
    if redis_url is None:
        raise RuntimeError("no Redis URL: the CLI starts an embedded Redis when none is configured")
    app[REDIS] = connect(redis_url)
    try:
        yield
    finally:
        await app[REDIS].aclose()


async def _pool(app: web.Application) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await app[POOL].close()


async def _stats_writer(app: web.Application) -> AsyncIterator[None]:
    writer = app[STATS] = StatsWriter(app[REDIS])
    async with _running(writer.run(), "stats-writer"):
        yield


async def _accounting(app: web.Application) -> AsyncIterator[None]:
    accounting = app[ACCOUNTING] = Accounting(app[STATS], app[REDIS])
    app[DASHBOARD] = DashboardStats(app[STATS], app[REDIS], accounting)
    async with _running(accounting.run(), "cache-expectations"):
        yield


async def _keys(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # One gate for both request-path checks: when the key check finds Redis frozen, the
    # rate-limit check of the same request does not wait for it again.
    gate = RedisGate(settings.redis_request_timeout_ms / 1000)
    keys = app[KEYS] = KeyStore(app[REDIS], cache_s=settings.key_cache_s, gate=gate)
    app[LIMITER] = Limiter(app[REDIS], app[STATS], gate)
    # The response cache's lookups share the gate: a frozen Redis is waited for once.
    view = None
    if settings.cache_view_max_keys:
        view = LocalView(settings.cache_view_max_keys, settings.cache_view_max_bytes)
    cache = ResponseCache(app[REDIS], gate, fast_client(settings.redis_url or "", gate), view)
    app[RESPONSE_CACHE] = cache
    async with _running(keys.watch_revocations(), "key-revocations"), _running(cache.track(), "cache-view"):
        yield
    await cache.drain()
    cache.close()


async def _policy(app: web.Application) -> AsyncIterator[None]:
    holder = app[POLICY]
    pool, dispatcher = app[POOL], app[DISPATCHER]

    def apply(snapshot: PolicySnapshot) -> None:
        pool.update(snapshot.policy)
        attach_launches(pool, list(snapshot.policy.deployments), app[SUPERVISOR])
        dispatcher.configure(snapshot.policy)

    settings = app[SETTINGS]
    if settings.policy_from_redis:
        # The fleet's pushed policy, before the first request (none pushed: the file's).
        with contextlib.suppress(*REDIS_FAULTS):
            await follow_policy_once(app[REDIS], holder)
        watch = follow_policy(app[REDIS], holder, settings.reload_interval_s)
    else:
        watch = holder.watch(settings.reload_interval_s)
    apply(holder.current)
    holder.on_change(apply)
    async with _running(watch, "policy-watch"):
        yield


async def _heartbeat(app: web.Application) -> AsyncIterator[None]:
    settings, holder, in_flight = app[SETTINGS], app[POLICY], app[IN_FLIGHT]
    member = app[FLEET] = FleetMember(
        app[REDIS],
        address=f"{settings.host}:{settings.port}",
        policy=lambda: (holder.current.digest, holder.current.version),
        in_flight=lambda: len(in_flight),
        draining=app[DRAINING].is_set,
        interval_s=settings.heartbeat_s,
    )
    async with _running(member.run(), "heartbeat"):
        yield


async def _shared_state(app: web.Application) -> AsyncIterator[None]:
    # Circuit states and segment stability are shared with the other replicas through Redis.
    async with (
        _running(app[DISPATCHER].breakers.share(app[REDIS]), "circuit-share"),
        _running(app[SHAPING].stability.sync(app[REDIS]), "stability-sync"),
    ):
        yield


async def _metrics_sync(app: web.Application) -> AsyncIterator[None]:
    async with _running(ops.sync_metrics_forever(app), "metrics-sync"):
        yield
    # The last requests' tallies, for the other workers' scrapes (and a restarted worker's).
    ops.sync_metrics(app)


async def _learning(app: web.Application) -> AsyncIterator[None]:
    # The shadow sample's calls run off the client's path; at stop they are dropped.
    dispatcher = app[DISPATCHER]
    shadow = app[SHADOW] = ShadowSampler(
        app[POOL], dispatcher.available, app[STATS], app[REDIS], on_outcome=app[METRICS].shadow_outcome
    )
    app[DRIFT] = DriftMonitor(app[POLICY])
    try:
        yield
    finally:
        await shadow.close()


async def _stages(app: web.Application) -> AsyncIterator[None]:
    limiter = app[LIMITER]
    # The sinks that only count stay per request; the costly ones take the records in
    # batches (gateway.telemetry.bookkeeping). Last to start, first to stop: the last
    # batch is folded before the metrics' last sync and the stats writer's last flush.
    book = app[BOOKKEEPING] = Bookkeeping(
        (app[ACCOUNTING].record_many, app[DASHBOARD].record_many, app[METRICS].record_many, tlog.log_requests)
    )
    app[STAGES] = Stages(
        settings=app[SETTINGS],
        shaping=app[SHAPING],
        dispatcher=app[DISPATCHER],
        limiter=limiter,
        stats=app[STATS],
        sinks=(book.add, limiter.record, app[DRIFT].record, app[FLEET].record),
        shadow=app[SHADOW],
        cache=app[RESPONSE_CACHE],
    )
    async with _running(book.run(), "bookkeeping"):
        yield


async def _tracing(app: web.Application) -> AsyncIterator[None]:
    try:
        yield
    finally:
        owned = app[TRACING]
        if owned is not None:
            # Flushes the batch processor (a blocking HTTP export at most): once, at exit.
            await asyncio.get_running_loop().run_in_executor(None, owned.shutdown)


def create_app(
    settings: Settings,
    holder: PolicyHolder | None = None,
    tracer: tracing.Tracing | None = None,
    supervisor: LaunchSupervisor | None = None,
) -> web.Application:
    """The gateway application for ``settings`` (the policy is loaded here unless given).

    Tracing is ``tracer`` when given (tests pass one with an in-memory exporter), else what
    the ``OTEL_*`` variables configure (off by default). ``supervisor`` runs the policy's
    ``launch:`` servers when this process started them (``/admin/replicas`` shows them)."""
    app = web.Application(middlewares=[context_middleware], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[AUTH_MODE] = settings.auth_mode()
    app[SECRETS] = {}
    app[DRAINING] = asyncio.Event()
    app[IN_FLIGHT] = set()
    app[READINESS] = Readiness()
    app[POLICY] = holder or PolicyHolder(settings.policy)
    pool = app[POOL] = UpstreamPool()
    app[DISPATCHER] = Dispatcher(pool)
    app[SHAPING] = ShapingState()
    app[METRICS] = Metrics()
    app[DASHBOARD_HTML] = DASHBOARD_PAGE.read_bytes()
    app[SUPERVISOR] = supervisor
    app[TRACING] = tracer if tracer is not None else tracing.Tracing.from_env()
    if tracer is None and app[TRACING] is not None:
        app.cleanup_ctx.append(_tracing)
    app.cleanup_ctx.extend(
        [
            _redis,
            _pool,
            _stats_writer,
            _accounting,
            _keys,
            _policy,
            _shared_state,
            _heartbeat,
            _metrics_sync,
            _learning,
            _stages,
        ]
    )
    chat = proxy.proxy("/chat/completions", ChatCompletionRequest, True)
    app.on_startup.append(ops.check_setup)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", proxy.proxy("/completions", CompletionRequest, True))
    app.router.add_post("/v1/embeddings", proxy.proxy("/embeddings", EmbeddingRequest, False))
    app.router.add_post("/v1/responses", responses_api.create_response)
    app.router.add_get("/v1/responses/{response_id}", responses_api.get_response)
    app.router.add_delete("/v1/responses/{response_id}", responses_api.delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", responses_api.list_input_items)
    app.router.add_get("/v1/models", proxy.list_models)
    app.router.add_get("/v1/models/{model}", proxy.get_model)
    app.router.add_post("/v1/fanout", proxy.fanout)
    app.router.add_post("/v1/messages", messages_api.messages)
    app.router.add_post("/v1/messages/count_tokens", messages_api.count_tokens)
    app.router.add_get("/healthz", ops.healthz)
    app.router.add_get("/readyz", ops.readyz)
    app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/dashboard", ops.dashboard_page)
    app.router.add_get("/", ops.root_redirect)
    app.add_subapp("/admin/", admin_app())
    return app
