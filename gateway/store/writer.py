"""Stats writes to Redis, off the request path: queued, pipelined, and dropped when Redis is slow.

A request only adds to in-process counters (:meth:`StatsWriter.counters`), to a capped
list (:meth:`StatsWriter.push`), or appends a small closure to a bounded queue
(:meth:`StatsWriter.add`). Counters are kept by the fields' common prefix (a request's
deployment, key and template) and the rest of the name, so a request's dozen counters cost
a dozen dict updates, not a dozen field names built and hashed; the names are joined at the
flush. A background task flushes all of them every ``flush_interval_s``: counters are summed
first and a list's new values go in one LPUSH,
so the work per flush depends on how many keys changed, not on the request rate.

The counters and lists go to Redis as one Lua script call (:data:`_WRITE_LUA`), not as a
pipeline of HINCRBY, EXPIRE, LPUSH and LTRIM: redis-py packs every command and parses
every reply in Python, and a pipeline of ~30 commands held the event loop for ~0.7 ms,
which requests that arrived meanwhile waited out (bench/probes/redis_writes.py). On a Redis
Cluster, whose scripts must keep their keys in one slot, they stay
a pipeline (the client splits it per node). Queued closures join the script call in one
pipeline. A key the script cannot write (say, of another type) counts one dropped write.

A flush that fails (Redis down, or a value it cannot encode) or takes longer than
``timeout_s`` drops its batch and counts the writes as dropped; the next flush goes on.
Requests never wait on Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Set
from itertools import chain, repeat
from operator import add
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

_log = structlog.get_logger("switchyard.store")

Op = Callable[[Any], None]
"""Queues commands on a redis pipeline."""


_WRITE_LUA = """
-- KEYS: the hashes, then the lists. ARGV[1]: how many hashes; then per hash its TTL, its
-- number of fields and (field, amount) pairs; per list how many to keep, its TTL, its
-- number of values and the values, oldest first. Returns how many keys failed.
local failed, a, hashes = 0, 2, tonumber(ARGV[1])
local function ok(reply) return not (type(reply) == 'table' and reply.err) end
for i = 1, #KEYS do
  local key, good = KEYS[i], true
  if i <= hashes then
    local ttl, n = ARGV[a], tonumber(ARGV[a + 1])
    a = a + 2
    for j = a, a + 2 * n - 1, 2 do
      good = ok(redis.pcall('HINCRBY', key, ARGV[j], ARGV[j + 1])) and good
    end
    a = a + 2 * n
    good = ok(redis.pcall('EXPIRE', key, ttl)) and good
  else
    local keep, ttl, n = tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2])
    a = a + 3
    for j = a, a + n - 1, 1000 do  -- unpack() of many values would overflow Lua's stack
      good = ok(redis.pcall('LPUSH', key, unpack(ARGV, j, math.min(j + 999, a + n - 1)))) and good
    end
    a = a + n
    good = ok(redis.pcall('LTRIM', key, 0, keep - 1)) and good
    good = ok(redis.pcall('EXPIRE', key, ttl)) and good
  end
  if not good then failed = failed + 1 end
end
return failed
"""
"""Every counter and list of one flush in one call: one reply for redis-py to parse."""


def add_one_each(counts: dict[str, int], keys: Set[str]) -> None:
    """Add 1 to the count of each of ``keys`` (absent: 0), at C speed (no Python frame per
    key): each count is read before it is written, and the keys are distinct."""
    counts.update(zip(keys, map(add, map(counts.get, keys, repeat(0)), repeat(1)), strict=True))


class StatsWriter:
    def __init__(
        self,
        redis: Redis,
        *,
        max_pending: int = 20_000,
        flush_interval_s: float = 0.1,
        timeout_s: float = 0.5,
    ) -> None:
        self._redis = redis
        self._pending: deque[Op] = deque()
        # Hash key -> field prefix -> the rest of the field's name -> amount.
        self._counters: dict[str, dict[str, dict[str, int]]] = {}
        self._ttls: dict[str, int] = {}
        self._lists: dict[str, _CappedList] = {}
        self._max_pending = max_pending
        self._flush_interval_s = flush_interval_s
        self._timeout_s = timeout_s
        self.written = 0
        self.dropped = 0
        self._last_warning = 0.0

    def add(self, op: Op) -> None:
        """Queue ``op``; when the queue is full the write is dropped and counted."""
        if len(self._pending) >= self._max_pending:
            self.dropped += 1
            return
        self._pending.append(op)

    def counters(self, key: str, prefix: str, ttl_s: int) -> dict[str, int]:
        """The in-process counters of the fields ``prefix + name`` of one hash, by ``name``:
        add to them (``c[name] = c.get(name, 0) + amount``); they are summed until the next
        flush. When too many keys wait, a throwaway (and a drop counted)."""
        prefixes = self._counters.get(key)
        if prefixes is None:
            if len(self._counters) >= self._max_pending:
                self.dropped += 1
                return {}
            prefixes = self._counters[key] = {}
            self._ttls[key] = ttl_s
        found = prefixes.get(prefix)
        if found is None:
            found = prefixes[prefix] = {}
        return found

    def hincr_each(self, key: str, fields: Set[str], ttl_s: int) -> None:
        """Add 1 to each of these fields of one hash (one call for many fields)."""
        add_one_each(self.counters(key, "", ttl_s), fields)

    def push(self, key: str, value: bytes, keep: int, ttl_s: int) -> None:
        """Prepend ``value`` to the list ``key``, of which Redis keeps the newest ``keep``;
        the values pushed between two flushes are sent in one LPUSH."""
        entry = self._lists.get(key)
        if entry is None:
            if len(self._lists) >= self._max_pending:
                self.dropped += 1
                return
            entry = self._lists[key] = _CappedList(keep, ttl_s)
        values = entry.values
        values.append(value)
        if len(values) > 2 * keep:  # older ones would be trimmed away: never sent
            self.dropped += len(values) - keep
            del values[:-keep]

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._counters) + len(self._lists)

    async def flush(self) -> None:
        """Write what is queued now: the counters and lists in one script call, with the
        queued closures in the same pipeline."""
        if not self._pending and not self._counters and not self._lists:
            return
        batch = list(self._pending)
        self._pending.clear()
        counters = {key: fields for key, prefixes in self._counters.items() if (fields := _joined(prefixes))}
        ttls, lists = self._ttls, self._lists
        self._counters, self._ttls, self._lists = {}, {}, {}
        size = len(batch) + len(counters) + sum(len(entry.values) for entry in lists.values())
        try:
            async with asyncio.timeout(self._timeout_s):
                failed = await self._write(batch, counters, ttls, lists)
        except (RedisError, OSError, TimeoutError, ValueError, TypeError) as exc:
            # ValueError, TypeError: a value redis-py cannot encode (text that is not UTF-8).
            # Dropped like the rest: the writer never stops.
            self._dropped(size, repr(exc))
        else:
            self.written += size - failed
            if failed:
                self._dropped(failed, "a Redis command failed (for example a key of another type)")

    async def _write(
        self,
        batch: list[Op],
        counters: dict[str, dict[str, int]],
        ttls: dict[str, int],
        lists: dict[str, _CappedList],
    ) -> int:
        """Send one flush; how many keys failed (counted by the script, 0 on a cluster)."""
        if isinstance(self._redis, RedisCluster):
            pipe = self._redis.pipeline(transaction=False)
            for key, fields in counters.items():
                for field, amount in fields.items():
                    pipe.hincrby(key, field, amount)
                pipe.expire(key, ttls[key])
            for key, entry in lists.items():
                pipe.lpush(key, *entry.values)
                pipe.ltrim(key, 0, entry.keep - 1)
                pipe.expire(key, entry.ttl_s)
            keys: list[str] = []
        else:
            keys = [*counters, *lists]
            args: list[Any] = [len(counters)]
            for key, fields in counters.items():
                args += (ttls[key], len(fields))
                args += chain.from_iterable(fields.items())
            for entry in lists.values():
                args += (entry.keep, entry.ttl_s, len(entry.values))
                args += entry.values
            if not batch:  # a pipeline of one command costs more than the command
                return int(await self._redis.eval(_WRITE_LUA, len(keys), *keys, *args))
            pipe = self._redis.pipeline(transaction=False)
            if keys:
                pipe.eval(_WRITE_LUA, len(keys), *keys, *args)
        for op in batch:
            op(pipe)
        replies = await pipe.execute()
        return int(replies[0]) if keys else 0

    def _dropped(self, writes: int, error: str) -> None:
        self.dropped += writes
        now = time.monotonic()
        if now - self._last_warning > 10:
            self._last_warning = now
            _log.warning("stats_writes_dropped", batch=writes, dropped_total=self.dropped, error=error)

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled; a last flush on the way out."""
        try:
            while True:
                await asyncio.sleep(self._flush_interval_s)
                await self.flush()
        finally:
            await asyncio.shield(self.flush())


def _joined(prefixes: dict[str, dict[str, int]]) -> dict[str, int]:
    """A hash's counters by their whole field name."""
    if len(prefixes) == 1 and "" in prefixes:
        return prefixes[""]
    fields: dict[str, int] = {}
    for prefix, names in prefixes.items():
        for name, amount in names.items():
            field = prefix + name
            fields[field] = fields.get(field, 0) + amount
    return fields


class _CappedList:
    """Values waiting to be pushed to one list, and how the list is capped."""

    __slots__ = ("keep", "ttl_s", "values")

    def __init__(self, keep: int, ttl_s: int) -> None:
        self.keep = keep
        self.ttl_s = ttl_s
        self.values: list[bytes] = []
