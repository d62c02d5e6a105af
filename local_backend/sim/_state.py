"""The simulator's live state: the per-model queues, caches and metrics, faults, counters."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import deque

from aiohttp import web

from local_backend.sim._config import ModelProfile, SimConfig
from local_backend.sim._faults import FaultTable
from local_backend.sim._messages_cache import MessagesCache
from local_backend.sim._stats import ModelMetrics, SimStats
from local_backend.sim._tokens import PrefixCache


class Admission:
    """vLLM's ``max_num_seqs``: at most ``limit`` requests run at once, the rest wait in
    arrival order (the wait is part of their latency)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Wait for a slot (FIFO)."""
        if self.running < self.limit and not self._waiters:
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over: ``running`` is already counted
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived together with the cancellation: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back, straight to the longest waiter if there is one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1


class SimState:
    """Everything one simulator instance knows: config, caches, queues, faults, counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.default_profile = ModelProfile()
        self.fault_rng = random.Random(config.seed)
        self.jitter_rng = random.Random(config.seed + 1)
        self.faults = FaultTable(config.faults, self.fault_rng)
        self.stats = SimStats()
        self.metrics: dict[str, ModelMetrics] = {name: ModelMetrics() for name in config.models}
        self.caches: dict[str, PrefixCache] = {}
        # Anthropic's explicit-breakpoint cache (POST /v1/messages), one per model.
        self.messages_caches: dict[str, MessagesCache] = {}
        self.admissions: dict[str, Admission] = {}
        self.started_at = int(time.time())
        self._id_prefix = os.urandom(6).hex()
        self._id_seq = 0

    def profile(self, model: str) -> ModelProfile | None:
        """The model's profile; ``None`` for an unknown model unless any model is accepted."""
        found = self.config.models.get(model)
        if found is None and self.config.accept_any_model:
            return self.default_profile
        return found

    def metrics_for(self, model: str) -> ModelMetrics:
        found = self.metrics.get(model)
        if found is None:
            found = self.metrics[model] = ModelMetrics()
        return found

    def cache_for(self, model: str) -> PrefixCache:
        # One cache per model: each model stands for its own vLLM deployment.
        found = self.caches.get(model)
        if found is None:
            found = self.caches[model] = PrefixCache(
                self.config.cache_capacity_blocks, self.config.cache_ttl_s
            )
        return found

    def admission_for(self, model: str) -> Admission:
        found = self.admissions.get(model)
        if found is None:
            found = self.admissions[model] = Admission(self.config.max_num_seqs)
        return found

    def new_id(self, prefix: str) -> str:
        self._id_seq += 1
        return f"{prefix}{self._id_prefix}{self._id_seq:012x}"

    def jittered_s(self, value_ms: float, jitter_ms: float) -> float:
        if jitter_ms > 0:
            value_ms = max(0.0, self.jitter_rng.gauss(value_ms, jitter_ms))
        return value_ms / 1000.0

    def reset(self) -> None:
        """``POST /sim/reset``: stats, fault rules, caches and metrics start over; the RNGs
        are re-seeded. Requests in flight keep their queue slots."""
        self.stats.reset()
        self.faults.rules.clear()
        for cache in self.caches.values():
            cache.clear()
        for messages_cache in self.messages_caches.values():
            messages_cache.clear()
        self.metrics = {name: ModelMetrics() for name in self.config.models}
        self.fault_rng.seed(self.config.seed)
        self.jitter_rng.seed(self.config.seed + 1)


SIM_STATE = web.AppKey("switchyard_sim_state", SimState)
