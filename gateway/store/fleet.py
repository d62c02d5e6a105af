"""The fleet's roll call: every gateway process writes a heartbeat to Redis, and any of them
lists the live ones (``GET /admin/fleet``, the dashboard's fleet panel).

All heartbeats live in one hash (``sy:fleet``, one field per process), so one ``HGETALL``
reads the whole fleet on a single Redis and on a Redis Cluster alike. A field holds what
an operator asks first of a gateway: where it runs, its version, the policy it serves
(digest and version), since when, how many requests it has in flight and its last error.

A gateway beats every ``heartbeat_s`` (``SWITCHYARD_HEARTBEAT_S``, default 2 s) and
removes its field when it stops; one that dies without stopping is shown as ``live:
false`` once its heartbeat is older than :data:`LIVE_BEATS` beats, and its field is
deleted after :data:`FORGET_BEATS`. Writing a heartbeat never touches a request: it runs
in its own task, bounded, and a failure is counted and tried again at the next beat.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from redis.asyncio import Redis

from gateway.store.gate import REDIS_FAULTS

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

_log = structlog.get_logger("switchyard.fleet")

FLEET_KEY = "sy:fleet"
LIVE_BEATS = 3
"""A heartbeat older than this many beats means the gateway is gone (stopped or cut off)."""
FORGET_BEATS = 30
"""A heartbeat older than this many beats is deleted by the next reader."""
_WRITE_BOUND_S = 1.0
# A fresh Redis Cluster client discovers the slots with its first command: on a loaded
# machine that alone has taken more than a second.
_FIRST_WRITE_BOUND_S = 5.0


def gateway_version() -> str:
    """The installed switchyard version (``unknown`` from a bare checkout)."""
    try:
        return metadata.version("switchyard")
    except metadata.PackageNotFoundError:
        return "unknown"


class FleetMember:
    """This process's heartbeat: what it serves, its load, its last error."""

    def __init__(
        self,
        redis: Redis,
        *,
        address: str,
        policy: Callable[[], tuple[str, int]],
        in_flight: Callable[[], int],
        draining: Callable[[], bool] = lambda: False,
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._policy = policy
        self._in_flight = in_flight
        self._draining = draining
        self.interval_s = interval_s
        self._clock = clock
        self.host = socket.gethostname()
        self.address = address
        self.pid = os.getpid()
        self.id = f"{self.host}/{address}/{self.pid}"
        self.version = gateway_version()
        self.started_at = clock()
        self.requests = 0
        self.failed = 0
        self.last_error: dict[str, Any] | None = None
        self.write_errors = 0
        self.beats = 0

    def record(self, done: FinishedRequest) -> None:
        """A request sink: count it, and keep the latest server-side failure (5xx or an
        error event after the answer started); client errors (4xx) are the client's."""
        self.requests += 1
        if done.status >= 500 or (done.error_code and done.status < 400):
            self.failed += 1
            self.last_error = {
                "at": round(self._clock(), 3),
                "status": done.status,
                "code": done.error_code,
                "deployment": done.deployment,
                "request_id": done.request_id,
            }

    def heartbeat(self) -> dict[str, Any]:
        """What this process writes at each beat."""
        digest, version = self._policy()
        now = self._clock()
        return {
            "id": self.id,
            "host": self.host,
            "address": self.address,
            "pid": self.pid,
            "version": self.version,
            "policy_digest": digest,
            "policy_version": version,
            "started_at": round(self.started_at, 3),
            "uptime_s": round(now - self.started_at, 3),
            "seen_at": round(now, 3),
            "in_flight": self._in_flight(),
            "draining": self._draining(),
            "requests": self.requests,
            "failed": self.failed,
            "last_error": self.last_error,
            "interval_s": self.interval_s,
        }

    async def beat(self) -> bool:
        """Write one heartbeat; False (counted) when Redis did not take it."""
        try:
            async with asyncio.timeout(_WRITE_BOUND_S if self.beats else _FIRST_WRITE_BOUND_S):
                await self._redis.hset(FLEET_KEY, self.id, orjson.dumps(self.heartbeat()))
        except REDIS_FAULTS as exc:
            self.write_errors += 1
            if self.write_errors == 1 or self.write_errors % 100 == 0:
                _log.warning("heartbeat_failed", error=type(exc).__name__, failures=self.write_errors)
            return False
        self.beats += 1
        return True

    async def run(self) -> None:
        """Beat every ``interval_s`` until cancelled; the field is removed on the way out."""
        try:
            while True:
                await self.beat()
                await asyncio.sleep(self.interval_s)
        finally:
            await asyncio.shield(self.leave())

    async def leave(self) -> None:
        """Remove this process from the roll call (a stopped gateway is not a lost one)."""
        try:
            async with asyncio.timeout(_WRITE_BOUND_S):
                await self._redis.hdel(FLEET_KEY, self.id)
        except REDIS_FAULTS:
            pass


async def fleet_report(redis: Redis, now: float | None = None) -> dict[str, Any]:
    """Every gateway that has a heartbeat: ``gateways`` (sorted by id, each with ``live`` and
    ``age_s``), the count of live ones, and ``policies``: how many live gateways serve each
    policy digest (one entry when the fleet agrees). Forgotten heartbeats are deleted."""
    now = time.time() if now is None else now
    raw: dict[Any, Any] = await redis.hgetall(FLEET_KEY)
    gateways, forgotten = [], []
    for field, value in raw.items():
        try:
            beat = orjson.loads(value)
            age = now - float(beat["seen_at"])
            interval = float(beat.get("interval_s") or 2.0)
        except (ValueError, KeyError, TypeError):
            forgotten.append(field)
            continue
        if age > FORGET_BEATS * interval:
            forgotten.append(field)
            continue
        beat["age_s"] = round(max(0.0, age), 3)
        beat["live"] = age <= LIVE_BEATS * interval
        if beat["live"]:
            # The uptime as of now, not of the beat.
            beat["uptime_s"] = round(now - float(beat["started_at"]), 3)
        gateways.append(beat)
    if forgotten:
        await redis.hdel(FLEET_KEY, *forgotten)
    gateways.sort(key=lambda b: str(b["id"]))
    policies: dict[str, int] = {}
    for beat in gateways:
        if beat["live"]:
            policies[beat["policy_digest"]] = policies.get(beat["policy_digest"], 0) + 1
    return {
        "gateways": gateways,
        "live": sum(1 for b in gateways if b["live"]),
        "policies": policies,
        "in_flight": sum(int(b["in_flight"]) for b in gateways if b["live"]),
    }
