"""Circuit breakers per deployment: a local fast path, shared across replicas through Redis.

The request path only reads and updates in-process state (no Redis round trip). When a
circuit opens, the gateway publishes ``sy:circuit:<deployment>`` in Redis with the time it
may be probed again (expiring with the cooldown); every replica polls those keys once a
second and opens its own circuit for a deployment another replica found broken.

Timeouts alone are judged as outlier ejection is (Envoy's): a deployment whose every recent
failure is one of the gateway's own timeouts opens only when it fails clearly more often
than its tier peers, and never when that would leave too few of a tier closed (see
:class:`~gateway.dispatch.policy.CircuitPolicy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.dispatch.clock import SYSTEM_CLOCK, Clock
from gateway.dispatch.failures import TIMEOUTS
from gateway.dispatch.policy import CircuitPolicy

_log = structlog.get_logger("switchyard.circuit")

State = Literal["closed", "open", "half_open"]
KEY_PREFIX = "sy:circuit:"


@dataclass(slots=True)
class Breaker:
    """The circuit of one deployment."""

    name: str
    state: State = "closed"
    consecutive_failures: int = 0
    opened_until: float = 0.0  # monotonic time from which a probe is allowed
    opened_at: float = float("-inf")
    probes_in_flight: int = 0
    outcomes: deque[tuple[float, bool, bool]] = field(default_factory=deque)
    """(clock time, ok, a timeout of ours) of the attempts in the policy's window, oldest first."""
    failures: int = 0  # of ``outcomes``: kept as they come and go, never counted over the window
    timeouts: int = 0  # of ``failures``, those that were the gateway's own timeouts
    opened_by: str = ""  # "local" or "shared"
    last_success_at: float = float("-inf")  # when the latest successful attempt ended
    last_failure: str = ""  # the reason of the latest failure (shown by /readyz)


def _expire(breaker: Breaker, before: float) -> deque[tuple[float, bool, bool]]:
    """Drop ``breaker``'s outcomes from before ``before`` (the window's start); the rest."""
    outcomes = breaker.outcomes
    while outcomes and outcomes[0][0] < before:
        _, ok, timeout = outcomes.popleft()
        breaker.failures -= not ok
        breaker.timeouts -= timeout
    return outcomes


def tier_open_cap(size: int, share: float) -> int:
    """How many of a tier of ``size`` deployments may be open at once for timeouts alone:
    ``share`` of it (at least one), never all of it."""
    return min(size - 1, max(1, math.floor(share * size)))


class Breakers:
    """Every deployment's circuit; ``available(name)`` is what routing and dispatch consult."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._breakers: dict[str, Breaker] = {}
        self.policy = CircuitPolicy()
        self.transitions: dict[tuple[str, str], int] = {}
        """(deployment, new state) -> count, for metrics."""
        self._to_publish: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._tiers: list[list[str]] = []

    def set_tiers(self, tiers: list[list[str]]) -> None:
        """The deployments of each tier: a deployment's peers, for judging timeouts."""
        self._tiers = [list(members) for members in tiers]

    def configure(self, policy: CircuitPolicy) -> None:
        """Apply a (re)loaded policy's ``dispatch.circuit``."""
        self.policy = policy

    def _get(self, name: str) -> Breaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = self._breakers[name] = Breaker(name)
        return breaker

    def _move(self, breaker: Breaker, state: State) -> None:
        if breaker.state == state:
            return
        breaker.state = state
        key = (breaker.name, state)
        self.transitions[key] = self.transitions.get(key, 0) + 1
        _log.warning("circuit_" + state, deployment=breaker.name, by=breaker.opened_by or None)

    def available(self, name: str) -> bool:
        """Whether an attempt on ``name`` may start now (moves an open circuit past its
        cooldown to half-open and reserves a probe; call :meth:`record` after the attempt)."""
        if not self.policy.enabled:
            return True
        breaker = self._breakers.get(name)
        if breaker is None or breaker.state == "closed":
            return True
        if breaker.state == "open":
            if self._clock.now() < breaker.opened_until:
                return False
            self._move(breaker, "half_open")
            breaker.probes_in_flight = 0
        if breaker.probes_in_flight >= self.policy.half_open_probes:
            return False
        breaker.probes_in_flight += 1
        return True

    def is_open(self, name: str) -> bool:
        """Open right now (no side effects: for status pages and choosers that only look)."""
        breaker = self._breakers.get(name)
        return (
            self.policy.enabled
            and breaker is not None
            and breaker.state == "open"
            and self._clock.now() < breaker.opened_until
        )

    def record(self, name: str, ok: bool, *, started_at: float | None = None, reason: str = "") -> None:
        """The outcome of an attempt on ``name`` (a failure is the upstream's fault: connect
        errors, timeouts, 5xx, rejected credentials; a client's 4xx or a 429 are not).

        ``started_at`` (clock time) is when the attempt began. Failures count as
        *consecutive* only if their attempts started after the latest success ended: a burst
        of timeouts from attempts that were all hanging while other attempts succeeded is
        not evidence of a dead deployment (it still counts towards ``failure_rate``)."""
        if not self.policy.enabled:
            return
        policy = self.policy
        breaker = self._get(name)
        now = self._clock.now()
        timeout = not ok and reason in TIMEOUTS
        breaker.outcomes.append((now, ok, timeout))
        breaker.failures += not ok
        breaker.timeouts += timeout
        outcomes = _expire(breaker, now - policy.window_s)
        if ok:
            breaker.last_success_at = now
        else:
            breaker.last_failure = reason
        if breaker.state == "open" and (started_at is None or started_at < breaker.opened_at):
            return  # an attempt from before the circuit opened: no news
        if breaker.state != "closed":
            if ok:
                # A probe (or a panic-routed attempt on an open circuit) succeeded.
                breaker.probes_in_flight = 0
                breaker.consecutive_failures = 0
                breaker.outcomes.clear()
                breaker.failures = 0
                breaker.opened_by = ""
                self._move(breaker, "closed")
            else:
                breaker.probes_in_flight = max(0, breaker.probes_in_flight - 1)
                self._open(breaker, now, "local")
            return
        if ok:
            breaker.consecutive_failures = 0
            return
        if started_at is None or started_at >= breaker.last_success_at:
            breaker.consecutive_failures += 1
        if breaker.consecutive_failures >= policy.consecutive_failures or (
            len(outcomes) >= policy.min_requests and breaker.failures / len(outcomes) >= policy.failure_rate
        ):
            if timeout and breaker.timeouts == breaker.failures and not self._outlier(breaker, now):
                return  # slow like its peers (a busy machine), or its tier would be left without one
            self._open(breaker, now, "local")

    def _outlier(self, breaker: Breaker, now: float) -> bool:
        """Whether ``breaker``, failing by timeouts alone, may open: it fails ``outlier_margin``
        more often than the other closed deployments of its tiers (pooled over the window), and
        each of its tiers keeps enough deployments closed (:func:`tier_open_cap`)."""
        policy = self.policy
        tiers = [members for members in self._tiers if breaker.name in members]
        peers = {name for members in tiers for name in members if name != breaker.name}
        attempts = failures = 0
        for name in peers:
            peer = self._get(name)
            if peer.state != "closed":
                continue  # compared with the peers that serve, as outlier detection does
            attempts += len(_expire(peer, now - policy.window_s))
            failures += peer.failures
        peer_rate = failures / attempts if attempts else 0.0
        own_rate = breaker.failures / len(breaker.outcomes)
        if own_rate - peer_rate < policy.outlier_margin:
            return False
        for members in tiers:
            already = sum(self._get(name).state != "closed" for name in members if name != breaker.name)
            if already + 1 > tier_open_cap(len(members), policy.max_open_share):
                return False
        return True

    def abandon(self, name: str) -> None:
        """An attempt let through by :meth:`available` ended with no verdict (cancelled)."""
        breaker = self._breakers.get(name)
        if breaker is not None and breaker.state == "half_open":
            breaker.probes_in_flight = max(0, breaker.probes_in_flight - 1)

    def _open(self, breaker: Breaker, now: float, by: str, until: float | None = None) -> None:
        breaker.opened_until = until if until is not None else now + self.policy.cooldown_s
        breaker.opened_at = now
        breaker.opened_by = by
        breaker.probes_in_flight = 0
        self._move(breaker, "open")
        if by == "local" and self.policy.shared:
            # Published as wall-clock milliseconds: replicas share no monotonic clock.
            wall = time.time() + (breaker.opened_until - now)
            self._to_publish[breaker.name] = wall
            self._wake.set()

    def status(self) -> dict[str, Any]:
        """Each circuit's state, JSON-ready (for the admin API)."""
        now = self._clock.now()
        out: dict[str, Any] = {}
        for name, b in self._breakers.items():
            recent = _expire(b, now - self.policy.window_s)
            out[name] = {
                "state": "open" if self.is_open(name) else ("half_open" if b.state != "closed" else "closed"),
                "opened_by": b.opened_by or None,
                "retry_in_s": round(max(0.0, b.opened_until - now), 3) if b.state == "open" else None,
                "consecutive_failures": b.consecutive_failures,
                "last_failure": b.last_failure or None,
                "window_attempts": len(recent),
                "window_failures": b.failures,
            }
        return out

    async def share(self, redis: Redis, interval_s: float = 1.0) -> None:
        """Publish circuits opened here and adopt those opened elsewhere, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if not self.policy.enabled or not self.policy.shared:
                continue
            try:
                async with asyncio.timeout(0.5):
                    await self._sync(redis)
            except (RedisError, OSError, TimeoutError) as exc:
                _log.debug("circuit_share_failed", error=repr(exc))

    def watch(self, deployments: list[str]) -> None:
        """The deployments whose shared circuits are polled (set on each policy load)."""
        for name in deployments:
            self._get(name)

    async def _sync(self, redis: Redis) -> None:
        publish, self._to_publish = self._to_publish, {}
        names = list(self._breakers)
        pipe = redis.pipeline(transaction=False)
        for name, until_wall in publish.items():
            ms = max(1, int((until_wall - time.time()) * 1000))
            pipe.set(KEY_PREFIX + name, str(until_wall), px=ms)
        for name in names:
            pipe.get(KEY_PREFIX + name)
        replies = await pipe.execute()
        now_wall, now = time.time(), self._clock.now()
        for name, value in zip(names, replies[len(publish) :], strict=True):
            if value is None:
                continue
            until_wall = float(value)
            breaker = self._get(name)
            if until_wall > now_wall and breaker.state != "open":
                self._open(breaker, now, "shared", until=now + (until_wall - now_wall))
