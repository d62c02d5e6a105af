"""The semantic cache (opt-in): the nearest stored answer to a request's last user turn.

A request's vector is its last user turn's static embedding
(:mod:`gateway.routing.static_embedder`, the ``[embeddings]`` extra); it is compared only
with the vectors stored under the same *group*: the same namespace, model, and everything
before that turn, byte for byte (the system prompt, the history, tools, settings). The
vectors live in Redis (``sy:rcv:<namespace>:<context hash>``: a hash of entry id -> float32
vector, with a version key bumped on every insert), so every gateway replica sees the same
entries; each process keeps a faiss HNSW index per group, rebuilt from Redis when the
version it read differs. The stored answer itself is the exact cache's entry under that id:
when it has expired, the vector is dropped and the lookup is a miss.

faiss-cpu was measured against hnswlib and usearch here (docs/cache.md): the fastest to
build, add to and query on 256-dimension vectors. It is imported when a policy turns the
semantic cache on, never at the gateway's import.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import structlog
from redis.asyncio import Redis

from gateway.cache.key import PREFIX, CachePlan
from gateway.cache.policy import missing_extra as missing_extra
from gateway.store.gate import REDIS_FAULTS, RedisGate

_log = structlog.get_logger("switchyard.cache")

_HNSW_M = 16
_GROUPS_KEPT = 1024
"""Groups whose index a process keeps (least recently used dropped first)."""


@dataclass(slots=True)
class _Group:
    version: bytes
    index: Any
    ids: list[str] = field(default_factory=list)


class SemanticIndex:
    """Nearest stored turns per group, synced from Redis; inserts written to Redis."""

    def __init__(self, redis: Redis, gate: RedisGate) -> None:
        self._redis = redis
        self._gate = gate
        self._groups: OrderedDict[str, _Group] = OrderedDict()
        self._embedder: Any = None
        self._faiss: Any = None
        self._np: Any = None

    def embed(self, plan: CachePlan) -> Any:
        """The plan's turn as a unit float32 vector (kept on the plan for its store)."""
        if plan.vector is None:
            if self._embedder is None:
                from gateway.routing.static_embedder import load

                self._embedder = load()
                self._np = importlib.import_module("numpy")
                self._faiss = importlib.import_module("faiss")
            plan.vector = self._np.asarray(self._embedder.embed(plan.turn), dtype=self._np.float32)
        return plan.vector

    async def nearest(self, plan: CachePlan) -> tuple[str, float] | None:
        """The closest stored turn of the plan's group: ``(entry key, similarity)``; None
        when the group is empty or Redis cannot answer."""
        gate = self._gate
        if gate.unreachable:
            gate.skip()
            return None
        vector = self.embed(plan)
        group_key = plan.group
        try:
            version = await gate.call(lambda: self._redis.get(group_key + ":ver"))
            if not isinstance(version, bytes):
                return None
            group = self._groups.get(group_key)
            if group is None or group.version != version:
                stored = await gate.call(lambda: self._redis.hgetall(group_key))
                group = self._rebuild(group_key, version, stored)
        except REDIS_FAULTS:
            plan.write = False
            return None
        self._groups.move_to_end(group_key)
        if not group.ids:
            return None
        sims, rows = group.index.search(vector.reshape(1, -1), 1)
        row = int(rows[0][0])
        if row < 0:
            return None
        entry_id = group.ids[row]
        return f"{PREFIX}{plan.namespace}:{entry_id}", float(sims[0][0])

    def _rebuild(self, group_key: str, version: bytes, stored: dict[Any, Any]) -> _Group:
        np, faiss = self._np, self._faiss
        dims = self._embedder.dimensions
        index = faiss.IndexHNSWFlat(dims, _HNSW_M, faiss.METRIC_INNER_PRODUCT)
        ids: list[str] = []
        vectors = []
        for raw_id, raw_vector in stored.items():
            vector = np.frombuffer(raw_vector, dtype=np.float32)
            if vector.shape != (dims,):
                continue  # not a vector of this embedder: ignored
            ids.append(raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id))
            vectors.append(vector)
        if vectors:
            index.add(np.stack(vectors))
        group = self._groups[group_key] = _Group(version, index, ids)
        while len(self._groups) > _GROUPS_KEPT:
            self._groups.popitem(last=False)
        return group

    async def add(self, plan: CachePlan, max_entries: int) -> None:
        """Store the plan's vector under its entry's id (called off the client's path)."""
        gate = self._gate
        if gate.unreachable:
            gate.skip()
            return
        vector = self.embed(plan)
        group_key, ttl_ms = plan.group, max(1, int(plan.ttl_s * 1000))

        async def write() -> None:
            if await self._redis.hlen(group_key) >= max_entries:
                return
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(group_key, plan.prompt_id, vector.tobytes())
            pipe.incr(group_key + ":ver")
            pipe.pexpire(group_key, ttl_ms)
            pipe.pexpire(group_key + ":ver", ttl_ms)
            await pipe.execute()

        try:
            await gate.call(write)
        except REDIS_FAULTS:
            return

    async def forget(self, plan: CachePlan, entry_key: str) -> None:
        """Drop a vector whose entry is gone (expired, evicted or corrupt)."""
        entry_id = entry_key.rpartition(":")[2]
        group_key = plan.group
        try:
            await self._gate.call(lambda: self._redis.hdel(group_key, entry_id))
            await self._gate.call(lambda: self._redis.incr(group_key + ":ver"))
        except REDIS_FAULTS:
            return
