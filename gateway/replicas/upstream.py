"""A deployment served by several vLLM replicas: one upstream that picks a replica per request.

Each gateway process watches every replica itself (``GET /health`` and ``GET /metrics``
on their own intervals), so the choice needs no shared state: a replica is eligible once
its ``/health`` answers 200, and its load is the larger of this gateway's requests in
flight to it and what vLLM reports running + waiting (which counts every gateway's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import structlog

from gateway.cachestats.prefix import GEOMETRY
from gateway.errors import UpstreamUnavailableError
from gateway.policy import Deployment
from gateway.providers.base import Provider
from gateway.providers.clients import http_transport
from gateway.providers.transport import Transport, TransportResponse
from gateway.providers.vllm import VllmProvider
from gateway.replicas.affinity import HashRing, affinity_key, choose
from gateway.replicas.policy import DEFAULT_REPLICAS, ReplicaSetPolicy, replica_urls
from gateway.replicas.vllm_metrics import IntervalFigures, VllmFigures, figures_from_text, interval

_log = structlog.get_logger("switchyard.replicas")

WINDOW_S = 60.0  # the admin figures' rate window
_WANTED = (
    "vllm:num_requests_",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_",
    "vllm:gpu_prefix_cache_",
    "vllm:time_to_first_token_seconds",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:cache_config_info",
)


def _only_wanted(text: str) -> str:
    # vLLM's /metrics is tens of kB; parse only the lines routing and the admin page read.
    return "\n".join(line for line in text.splitlines() if line.startswith(_WANTED))


class ReplicaEndpoint:
    """One replica as this gateway sees it."""

    __slots__ = (
        "base_url",
        "chunks",
        "chunks_at_check",
        "client",
        "failures",
        "figures",
        "healthy",
        "history",
        "home",
        "in_flight",
        "index",
        "last_error",
        "least_loaded",
        "routed",
        "scraped_at",
        "spilled",
    )

    def __init__(self, index: int, base_url: str, client: Transport) -> None:
        self.index = index
        self.base_url = base_url
        self.client = client
        self.healthy = False
        self.failures = 0
        self.chunks = 0  # answer chunks relayed from this replica (its streams' progress)
        self.chunks_at_check = 0
        self.in_flight = 0
        self.routed = 0
        self.home = 0
        self.spilled = 0
        self.least_loaded = 0
        self.last_error: str | None = None
        self.figures: VllmFigures | None = None
        self.scraped_at: float | None = None
        self.history: deque[tuple[float, VllmFigures]] = deque()

    def load(self, stale_after_s: float) -> float:
        """Requests on this replica: ours in flight, or vLLM's running + waiting if it says more."""
        reported = 0.0
        fresh = self.scraped_at is not None and time.monotonic() - self.scraped_at <= stale_after_s
        if self.figures is not None and fresh:
            reported = self.figures.queue
        return max(float(self.in_flight), reported)

    def window(self) -> IntervalFigures | None:
        """Rates over the last :data:`WINDOW_S` of scrapes."""
        if len(self.history) < 2:
            return None
        return interval(self.history[0][1], self.history[-1][1])

    def status(self, stale_after_s: float) -> dict[str, Any]:
        window = self.window()
        return {
            "url": self.base_url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "load": self.load(stale_after_s),
            "routed": self.routed,
            "routed_by": {"home": self.home, "spilled": self.spilled, "least_loaded": self.least_loaded},
            "last_error": self.last_error,
            "scraped_age_s": round(time.monotonic() - self.scraped_at, 2) if self.scraped_at else None,
            "metrics": self.figures.to_dict() if self.figures is not None else None,
            "window": None
            if window is None
            else {
                "seconds": round(self.history[-1][0] - self.history[0][0], 1),
                "prefix_cache_hit_rate": window.hit_rate,
                "prefix_cache_queries_tokens": window.queries_tokens,
                "prefix_cache_hits_tokens": window.hits_tokens,
                "requests": window.requests,
                "ttft_mean_s": window.ttft_mean_s,
                "ttft_p50_s": window.ttft_p50_s,
                "ttft_p95_s": window.ttft_p95_s,
            },
        }


class _CountedResponse(TransportResponse):
    """The replica's answer; its in-flight count drops when the answer is closed or released."""

    __slots__ = ("_done", "_inner", "_replica", "headers", "status")

    def __init__(self, inner: TransportResponse, replica: ReplicaEndpoint) -> None:
        self._inner = inner
        self._replica = replica
        self._done = False
        self.status = inner.status
        self.headers = inner.headers

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._replica.in_flight -= 1

    async def read(self) -> bytes:
        return await self._inner.read()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self._counted(self._inner.iter_chunks())

    async def _counted(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        replica = self._replica
        async for chunk in chunks:
            replica.chunks += 1
            yield chunk

    def complete(self) -> bool:
        return self._inner.complete()

    def close(self) -> None:
        self._finish()
        self._inner.close()

    def release(self) -> None:
        self._finish()
        self._inner.release()


class ReplicaSetUpstream(VllmProvider):
    """A ``provider: vllm`` deployment with ``launch:`` or ``replicas:``: routes each request
    to one healthy replica (prefix affinity with bounded load, else least loaded), and
    is not :attr:`ready` until a replica answers ``/health``."""

    @classmethod
    def create(cls, name: str, deployment: Deployment) -> Provider:
        """The registry's entry for ``provider: vllm``: a replica set for ``launch:`` or
        ``replicas:``, else the plain one-URL adapter."""
        if deployment.launch is not None or deployment.replicas is not None:
            return cls(name, deployment)
        return VllmProvider(name, deployment)

    def __init__(self, name: str, deployment: Deployment) -> None:
        super().__init__(name, deployment)
        self.policy: ReplicaSetPolicy = deployment.replicas or DEFAULT_REPLICAS
        urls = replica_urls(deployment)
        self.replicas = [
            ReplicaEndpoint(i, url, http_transport(url, deployment)) for i, url in enumerate(urls)
        ]
        self.ring = HashRing(urls)
        self._ties = itertools.count()
        self._stale_after_s = 3 * self.policy.metrics_interval_s
        headers = dict(deployment.headers)
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._probe_headers = headers
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._first_check: asyncio.Event | None = None
        self.launch_error: Callable[[], str | None] | None = None
        """Why this deployment's launch was refused for good, when this gateway runs it."""
        self.replica_url: Callable[[int], str | None] | None = None
        """Where a launched replica serves now (a restart may move it to a fresh port)."""
        self._ensure_monitor()

    # -- watching the replicas ---------------------------------------------------------

    def _ensure_monitor(self) -> None:
        if self._tasks:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started on first use, inside the gateway's loop
        self._first_check = asyncio.Event()
        self._session = aiohttp.ClientSession(
            headers=self._probe_headers, timeout=aiohttp.ClientTimeout(total=self.policy.probe_timeout_s)
        )
        self._tasks = [
            loop.create_task(self._health_loop(), name=f"replicas-health-{self.name}"),
            loop.create_task(self._metrics_loop(), name=f"replicas-metrics-{self.name}"),
        ]

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(replica) for replica in self.replicas))
            if self._first_check is not None:
                self._first_check.set()
            await asyncio.sleep(self.policy.health_interval_s)

    async def _check(self, replica: ReplicaEndpoint) -> None:
        assert self._session is not None
        await self._follow(replica)
        url = replica.base_url.removesuffix("/v1") + "/health"
        error: str | None = None
        try:
            async with self._session.get(url) as resp:
                await resp.read()
                if resp.status != 200:
                    error = f"/health answered {resp.status}"
        except aiohttp.ClientConnectorError as exc:
            error = f"cannot connect: {exc.os_error or exc}"
            replica.failures = self.policy.unhealthy_after  # nothing listens: out at once
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"/health failed: {type(exc).__name__}"
        progressed = replica.chunks > replica.chunks_at_check
        replica.chunks_at_check = replica.chunks
        if error is None:
            if not replica.healthy:
                _log.info("replica_healthy", deployment=self.name, url=replica.base_url)
            replica.healthy, replica.failures, replica.last_error = True, 0, None
            return
        if progressed and replica.failures < self.policy.unhealthy_after:
            # Its streams still produce tokens: slow because busy, not down (a refused
            # connection has already counted as unhealthy_after failures above).
            _log.info("replica_health_slow_but_streaming", deployment=self.name, url=replica.base_url)
            return
        replica.last_error = error
        replica.failures += 1
        if replica.failures >= self.policy.unhealthy_after and replica.healthy:
            replica.healthy = False
            _log.warning("replica_unhealthy", deployment=self.name, url=replica.base_url, error=error)

    async def _follow(self, replica: ReplicaEndpoint) -> None:
        """Point ``replica`` at the port its supervisor restarted it on, if it moved."""
        url = self.replica_url(replica.index) if self.replica_url is not None else None
        if url is None or url == replica.base_url:
            return
        _log.warning("replica_moved", deployment=self.name, old_url=replica.base_url, url=url)
        old = replica.client
        replica.base_url, replica.client = url, http_transport(url, self.deployment)
        replica.healthy, replica.failures = False, 0
        await old.close()

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._scrape(replica) for replica in self.replicas))
            await asyncio.sleep(self.policy.metrics_interval_s)

    async def _scrape(self, replica: ReplicaEndpoint) -> None:
        assert self._session is not None
        url = replica.base_url.removesuffix("/v1") + "/metrics"
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    return
                text = await resp.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError):
            return
        figures = figures_from_text(_only_wanted(text), model_name=self.upstream_model)
        now = time.monotonic()
        replica.figures, replica.scraped_at = figures, now
        if figures.block_size is not None:
            # The expected-hit accounting counts in this deployment's own blocks.
            GEOMETRY.use_vllm(self.name, figures.block_size)
        replica.history.append((now, figures))
        while len(replica.history) > 2 and now - replica.history[1][0] >= WINDOW_S:
            replica.history.popleft()

    # -- the Provider interface --------------------------------------------------------

    @property
    def ready(self) -> bool:
        """At least one replica answers ``/health``."""
        self._ensure_monitor()
        return any(replica.healthy for replica in self.replicas)

    def _unavailable(self) -> UpstreamUnavailableError:
        refused = self.launch_error() if self.launch_error is not None else None
        if refused is not None:
            refusal = UpstreamUnavailableError(f"deployment '{self.name}' cannot start: {refused}")
            # The preflight's reason is the operator's to act on and names no deployment (#50 item 12).
            refusal.public = f"The deployment cannot start: {refused}"
            return refusal
        healthy = sum(r.healthy for r in self.replicas)
        errors = sorted({r.last_error for r in self.replicas if r.last_error})
        detail = f" ({'; '.join(errors)})" if errors else " (starting)"
        error = UpstreamUnavailableError(
            f"deployment '{self.name}' is not ready: {healthy} of {len(self.replicas)} replicas "
            f"answer /health{detail}"
        )
        error.public = (
            f"The deployment is not ready yet: {healthy} of {len(self.replicas)} replicas answer /health; "
            "retry shortly."
        )
        return error

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        self._ensure_monitor()
        first = self._first_check
        if first is not None and not first.is_set():
            # Just started: give the first round of health checks a moment.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(first.wait(), self.policy.probe_timeout_s)
        key = affinity_key(body) if self.policy.prefix_affinity else None
        tried: set[int] = set()
        while True:
            eligible = [r.healthy and r.index not in tried for r in self.replicas]
            loads = [r.load(self._stale_after_s) for r in self.replicas]
            picked = choose(
                self.ring,
                loads,
                eligible,
                key,
                self.policy.load_factor,
                next(self._ties),
                self.policy.load_slack,
            )
            if picked is None:
                raise self._unavailable()
            replica = self.replicas[picked.index]
            replica.in_flight += 1
            replica.routed += 1
            if picked.how == "home":
                replica.home += 1
            elif picked.how == "spilled":
                replica.spilled += 1
            else:
                replica.least_loaded += 1
            try:
                resp = await replica.client.send(
                    endpoint, body, headers=headers, connect_timeout_s=connect_timeout_s
                )
            except aiohttp.ClientConnectorError as exc:
                # Nothing was sent: take the replica out and try the next one.
                replica.in_flight -= 1
                replica.healthy = False
                replica.failures = self.policy.unhealthy_after
                replica.last_error = f"cannot connect: {exc.os_error or exc}"
                _log.warning("replica_unreachable", deployment=self.name, url=replica.base_url)
                tried.add(picked.index)
                if not any(r.healthy and r.index not in tried for r in self.replicas):
                    raise
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            return _CountedResponse(resp, replica)

    def status(self) -> dict[str, Any]:
        """JSON-ready: readiness, routing settings and each replica's state and vLLM figures."""
        replicas = [r.status(self._stale_after_s) for r in self.replicas]
        queries = sum((r["window"] or {}).get("prefix_cache_queries_tokens", 0.0) for r in replicas)
        hits = sum((r["window"] or {}).get("prefix_cache_hits_tokens", 0.0) for r in replicas)
        return {
            "ready": any(r.healthy for r in self.replicas),
            "healthy_replicas": sum(r.healthy for r in self.replicas),
            "prefix_affinity": self.policy.prefix_affinity,
            "load_factor": self.policy.load_factor,
            "load_slack": self.policy.load_slack,
            "prefix_cache_hit_rate": hits / queries if queries else None,
            "replicas": replicas,
        }

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        for replica in self.replicas:
            await replica.client.close()
