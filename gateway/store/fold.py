"""Sums of many counter hashes, folded in Redis: what the dashboard, the cache report and
the spend per day read.

The first two read one hash per minute of their window (``sy:dash:<minute>``,
``sy:cs:<minute>``), the third one per day (``sy:cost:<day>``), with a field per
deployment, key (and template) and metric. Read as HGETALL replies,
redis-py parsed every field and value in Python: an hour of three deployments and ten keys
held the event loop for about 2 s, at every refresh of the dashboard page (every 5 s by
default), while no request moved. :data:`_FOLD_LUA` sums the fields in Redis and returns
only the sums, as one JSON string that ``orjson`` reads at C speed.

A round trip folds about :data:`FIELDS_PER_CALL` fields (as many hashes as the ones before
held that many), so Redis is never busy with one call for long (~20 ms) and the event loop
serves requests between them. On a Redis Cluster, whose scripts must keep their keys in one
slot, each hash is a call of its own, as many to a pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.store import eval_each

FIELDS_PER_CALL = 20_000
"""About how many fields one round trip folds (the hashes per call follow their size)."""
FIRST_CHUNK = 10
MAX_CHUNK = 60

Grouping = Literal["first_last", "last", "whole"]
"""How a field is named in the per-point sums: its first and last ``|``-separated parts
(``deployment|metric``), its last part only (``metric``), or the whole field."""

_FOLD_LUA = """
-- KEYS: counter hashes. ARGV[i]: the point KEYS[i] belongs to; then the grouping
-- ('first_last', 'last', 'whole', or 'none': no per-point sums) and whether to return the
-- totals ('1' or '0').
-- Returns {"total": {field: sum}, "points": {point: {group: sum}}, "read": fields} as
-- JSON, every sum a decimal string (exact to 2^53; JSON numbers from Lua keep only 14
-- digits).
local n = #KEYS
local grouping, want_total = ARGV[n + 1], ARGV[n + 2] == '1'
local total, points, group_of, read = {}, {}, {}, 0
for i = 1, n do
  local flat = redis.call('HGETALL', KEYS[i])
  read = read + #flat / 2
  local at = points[ARGV[i]]
  if at == nil and #flat > 0 and grouping ~= 'none' then  -- a point without fields is left out
    at = {}
    points[ARGV[i]] = at
  end
  for j = 1, #flat, 2 do
    local field, v = flat[j], tonumber(flat[j + 1])
    if want_total then total[field] = (total[field] or 0) + v end
    if at then
      local group = group_of[field]  -- the minutes repeat their fields: matched once
      if group == nil then
        if grouping == 'whole' then
          group = field
        else
          group = string.match(field, '[^|]*$')
          if grouping == 'first_last' then group = string.match(field, '^[^|]*') .. '|' .. group end
        end
        group_of[field] = group
      end
      at[group] = (at[group] or 0) + v
    end
  end
end
local function decimal(sums)
  local out = {}
  for k, v in pairs(sums) do out[k] = string.format('%.0f', v) end
  return out
end
local shown = {}
for p, sums in pairs(points) do shown[p] = decimal(sums) end
return cjson.encode({total = decimal(total), points = shown, read = read})
"""


async def fold(
    redis: Redis,
    keys: Sequence[str],
    points: Sequence[int] | None = None,
    grouping: Grouping = "whole",
    total: bool = True,
) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """The sum of each field over ``keys`` (if ``total``), and per point (``points[i]`` is
    the point of ``keys[i]``) the sums of the fields' groups (:data:`Grouping`); without
    ``points``, no per-point sums."""
    if points is None:
        points, mode = [0] * len(keys), "none"
    else:
        mode = grouping
    cluster = isinstance(redis, RedisCluster)
    sums: dict[str, int] = {}
    by_point: dict[int, dict[str, int]] = {}
    start, chunk = 0, FIRST_CHUNK
    while start < len(keys):
        part, part_points = keys[start : start + chunk], points[start : start + chunk]
        start += len(part)
        calls: list[tuple[Sequence[str], list[Any]]]
        if cluster:  # a call per hash: a script's keys must share a slot
            calls = [([key], [point, mode, int(total)]) for key, point in zip(part, part_points, strict=True)]
        else:
            calls = [(part, [*part_points, mode, int(total)])]
        replies = await eval_each(redis, _FOLD_LUA, calls)
        read = 0
        for reply in replies:
            folded = orjson.loads(reply)
            read += folded["read"]
            for field, value in folded["total"].items():
                sums[field] = sums.get(field, 0) + int(value)
            for point, groups in folded["points"].items():
                at = by_point.setdefault(int(point), {})
                for group, value in groups.items():
                    at[group] = at.get(group, 0) + int(value)
        chunk = max(1, min(MAX_CHUNK, FIELDS_PER_CALL * len(part) // max(read, 1)))
    return sums, by_point
