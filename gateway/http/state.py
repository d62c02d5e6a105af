"""The typed keys of the app's state and of a request's context: every handler imports them
from here (a leaf module: it wires nothing)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from redis.asyncio import Redis

from gateway.auth.keys import KeyStore
from gateway.auth.limits import Limiter
from gateway.cache.service import ResponseCache
from gateway.cachestats import Accounting
from gateway.config import PolicyHolder, Settings
from gateway.context import RequestContext
from gateway.dashboard import DashboardStats
from gateway.dispatch.dispatcher import Dispatcher
from gateway.pipeline import Stages
from gateway.providers.pool import UpstreamPool
from gateway.replicas.status import LaunchSupervisor
from gateway.routing.drift import DriftMonitor
from gateway.routing.shadow import ShadowSampler
from gateway.shaping.service import ShapingState
from gateway.store.fleet import FleetMember
from gateway.store.writer import StatsWriter
from gateway.telemetry import tracing
from gateway.telemetry.bookkeeping import Bookkeeping
from gateway.telemetry.metrics import Metrics


@dataclass(slots=True)
class Readiness:
    """What ``/readyz`` remembers between calls."""

    redis_reached: bool = False
    """Redis has answered since the start (until then a wrong URL is the likelier cause)."""


SETTINGS = web.AppKey("settings", Settings)
POLICY = web.AppKey("policy", PolicyHolder)
POOL = web.AppKey("pool", UpstreamPool)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
SHAPING = web.AppKey("shaping", ShapingState)
METRICS = web.AppKey("metrics", Metrics)
TRACING: web.AppKey[tracing.Tracing | None] = web.AppKey("tracing")
SUPERVISOR: web.AppKey[LaunchSupervisor | None] = web.AppKey("vllm_supervisor")
"""The ``launch:`` servers' supervisor, when this gateway process runs them."""
REDIS = web.AppKey("redis", Redis)
STATS = web.AppKey("stats", StatsWriter)
ACCOUNTING = web.AppKey("accounting", Accounting)
DASHBOARD = web.AppKey("dashboard", DashboardStats)
DASHBOARD_HTML = web.AppKey("dashboard_html", bytes)
KEYS = web.AppKey("keys", KeyStore)
LIMITER = web.AppKey("limiter", Limiter)
RESPONSE_CACHE = web.AppKey("response_cache", ResponseCache)
STAGES = web.AppKey("stages", Stages)
BOOKKEEPING = web.AppKey("bookkeeping", Bookkeeping)
SHADOW = web.AppKey("shadow", ShadowSampler)
DRIFT = web.AppKey("drift", DriftMonitor)
FLEET = web.AppKey("fleet", FleetMember)
AUTH_MODE = web.AppKey("auth_mode", str)
SECRETS = web.AppKey("secrets", dict[int, tuple[str, ...]])
DRAINING = web.AppKey("draining", asyncio.Event)
IN_FLIGHT = web.AppKey("in_flight", set[asyncio.Task[Any]])
READINESS = web.AppKey("readiness", Readiness)

CTX = web.RequestKey("ctx", RequestContext)
