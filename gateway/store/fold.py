"""Sums of many counter hashes, folded in Redis: what the dashboard and the cache report read.

Both read one hash per minute of their window (``sy:dash:<minute>``, ``sy:cs:<minute>``),
with a field per deployment, key (and template) and metric. Read as HGETALL replies,
redis-py parsed every field and value in Python: an hour of three deployments and ten keys
held the event loop for ~1.9 s, at every refresh of the dashboard page (every 5 s by
default), while no request moved. :data:`_FOLD_LUA` sums the fields in Redis and returns
only the sums, as one JSON string that ``orjson`` reads at C speed.

A round trip folds at most :data:`CHUNK` hashes, so Redis is never busy with one for long
and the event loop serves requests between them. On a Redis Cluster, whose scripts must
keep their keys in one slot, each hash is a call of its own, :data:`CHUNK` to a pipeline
(the client sends each to its node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

CHUNK = 30
"""Hashes per script call: half an hour of minutes, ~30,000 fields for 1,000 a minute."""

Grouping = Literal["first_last", "last"]
"""How a field is named in the per-point sums: its first and last ``|``-separated parts
(``deployment|metric``), or its last part only (``metric``)."""

_FOLD_LUA = """
-- KEYS: counter hashes. ARGV[i]: the point KEYS[i] belongs to; then the grouping
-- ('first_last' or 'last') and whether to return the totals ('1' or '0').
-- Returns {"total": {field: sum}, "points": {point: {group: sum}}} as JSON, every sum a
-- decimal string (exact to 2^53; JSON numbers from Lua keep only 14 digits).
local n = #KEYS
local grouping, want_total = ARGV[n + 1], ARGV[n + 2] == '1'
local total, points, group_of = {}, {}, {}
for i = 1, n do
  local flat = redis.call('HGETALL', KEYS[i])
  local at = points[ARGV[i]]
  if at == nil and #flat > 0 then  -- a point without fields is left out
    at = {}
    points[ARGV[i]] = at
  end
  for j = 1, #flat, 2 do
    local field, v = flat[j], tonumber(flat[j + 1])
    if want_total then total[field] = (total[field] or 0) + v end
    local group = group_of[field]  -- the minutes repeat their fields: matched once
    if group == nil then
      group = string.match(field, '[^|]*$')
      if grouping == 'first_last' then group = string.match(field, '^[^|]*') .. '|' .. group end
      group_of[field] = group
    end
    at[group] = (at[group] or 0) + v
  end
end
local function decimal(sums)
  local out = {}
  for k, v in pairs(sums) do out[k] = string.format('%.0f', v) end
  return out
end
local shown = {}
for p, sums in pairs(points) do shown[p] = decimal(sums) end
return cjson.encode({total = decimal(total), points = shown})
"""


async def fold(
    redis: Redis, keys: Sequence[str], points: Sequence[int], grouping: Grouping, total: bool = True
) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """The sum of each field over ``keys`` (if ``total``), and per point (``points[i]`` is
    the point of ``keys[i]``) the sums of the fields' groups (:data:`Grouping`)."""
    cluster = isinstance(redis, RedisCluster)
    sums: dict[str, int] = {}
    by_point: dict[int, dict[str, int]] = {}
    for start in range(0, len(keys), CHUNK):
        part, part_points = keys[start : start + CHUNK], points[start : start + CHUNK]
        if cluster:
            pipe = redis.pipeline(transaction=False)
            for key, point in zip(part, part_points, strict=True):
                pipe.eval(_FOLD_LUA, 1, key, point, grouping, int(total))
            replies = await pipe.execute()
        else:
            replies = [await redis.eval(_FOLD_LUA, len(part), *part, *part_points, grouping, int(total))]
        for reply in replies:
            folded = orjson.loads(reply)
            for field, value in (folded["total"] or {}).items():
                sums[field] = sums.get(field, 0) + int(value)
            for point, groups in (folded["points"] or {}).items():
                at = by_point.setdefault(int(point), {})
                for group, value in groups.items():
                    at[group] = at.get(group, 0) + int(value)
    return sums, by_point
