"""The learned stability model: which system-prompt lines of a template recur.

Per template (named by the client, or the hash of its longest line, masked), Redis
counts how many of its recent requests carried each line (by hash):
``sy:stab:{template}:{hour}``, the current and the previous hour read together, so old
habits fade. A line found in at least ``stable_share`` of the template's requests is
stable; one found in fewer is volatile (a user's name, a retrieved snippet: content no
detector knows). Until a template has ``learn_min_requests`` requests the detectors
alone decide.

Once a template has 64 requests counted, one request in four is counted, and once it has
256, one in sixteen: the shares a verdict reads stay the same (a few hundred requests
measure a share to a few points), and the request path does a fraction of the work.

The request path reads only in-process counts. They are updated with each request and
replaced, off the request path, by the shared counts from Redis (every few seconds for the
templates this process served since their last load, and as soon as a template is first
seen), so the model is shared by every replica and survives restarts.

A template's two hours are summed in Redis (:func:`gateway.store.fold.fold`, about 20,000
counts a round trip, so requests move between them): read as HGETALL replies, redis-py
parsed every field and count in Python, and 500 templates of 160 counts held the event
loop for ~0.7 s (``bench/probes/redis_writes.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.store.fold import fold
from gateway.store.writer import StatsWriter, add_one_each

_log = structlog.get_logger("switchyard.shaping")

COUNT_FIELD = "__n"
HOUR_S = 3600
SAMPLE_AFTER = 64
SAMPLE_EVERY = 4
SAMPLE_MORE_AFTER = 256
SAMPLE_EVERY_MORE = 16
TTL_S = 3 * HOUR_S


def _key(template: str, hour: int) -> str:
    return f"sy:stab:{{{template}}}:{hour}"


@dataclass(slots=True)
class _Counts:
    n: int = 0
    lines: dict[str, int] = field(default_factory=dict)
    fresh: bool = False  # loaded from Redis at least once
    calls: int = 0  # requests seen by this process, counted or not
    loaded_at_calls: int = -1  # ``calls`` when it was last loaded
    last: tuple[dict[str, int], int, int, list[str], list[bool | None]] | None = None
    """The last verdicts read (see :meth:`StabilityModel.verdicts`): the counts they were read
    from (``lines``, the very dict, and ``n``), the count they needed, the hashes and the
    verdicts (neither list is changed after: callers copy the verdicts they change)."""


class StabilityModel:
    """Line counts per template: local reads, shared through Redis."""

    def __init__(self, max_templates: int = 5_000) -> None:
        self._templates: OrderedDict[str, _Counts] = OrderedDict()
        self._max = max_templates
        self._to_load: set[str] = set()
        self._wake = asyncio.Event()

    def verdicts(
        self, template: str, hashes: list[str], min_requests: int, stable_share: float
    ) -> list[bool | None]:
        """Per line: True stable, False volatile, None not known yet."""
        counts = self._templates.get(template)
        if counts is None or counts.n < min_requests:
            return [None] * len(hashes)
        # Counts are whole: count >= share * n is count >= its ceiling.
        need = math.ceil(stable_share * counts.n)
        get = counts.lines.get
        last = counts.last
        if (
            last is not None
            and last[0] is counts.lines
            and last[1] == counts.n
            and last[2] == need
            and len(last[3]) == len(hashes)
        ):
            # The counts are as they were (a busy template's requests are counted one in a few;
            # a count changes only with ``n``, or with a new dict): a unit whose hash is the very
            # string read then has the verdict it had. A template's next head shares the strings
            # of its unchanged units, so only the others are looked up.
            out = list(last[4])
            for i in compress(range(len(hashes)), map(is_not, hashes, last[3])):
                out[i] = get(hashes[i], 0) >= need
        else:
            out = [get(h, 0) >= need for h in hashes]
        counts.last = (counts.lines, counts.n, need, hashes, out)
        return out

    def observe(self, template: str, hashes: list[str], writer: StatsWriter | None) -> None:
        """Count one request of ``template`` carrying these lines."""
        counts = self._templates.get(template)
        if counts is None:
            counts = self._templates[template] = _Counts()
            self._to_load.add(template)
            self._wake.set()
            if len(self._templates) > self._max:
                self._templates.popitem(last=False)
        else:
            self._templates.move_to_end(template)
        counts.calls += 1
        if counts.n >= SAMPLE_AFTER and counts.calls % (
            SAMPLE_EVERY if counts.n < SAMPLE_MORE_AFTER else SAMPLE_EVERY_MORE
        ):
            return  # a busy template: a sample keeps the shares (and costs a fraction)
        counts.n += 1
        distinct = set(hashes)
        add_one_each(counts.lines, distinct)
        if counts.n > 10_000:  # without Redis nothing else ages the counts
            counts.n //= 2
            counts.lines = {h: c // 2 for h, c in counts.lines.items() if c > 1}
        if writer is not None:
            distinct.add(COUNT_FIELD)
            writer.hincr_each(_key(template, int(time.time()) // HOUR_S), distinct, TTL_S)

    async def sync(self, redis: Redis, interval_s: float = 5.0) -> None:
        """Load new templates at once and refresh the active ones every ``interval_s``, until cancelled."""
        last_full = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            if now - last_full >= interval_s:
                # The most recently used that served a request since they were loaded.
                names = [n for n, c in list(self._templates.items())[-500:] if c.calls != c.loaded_at_calls]
                last_full = now
            else:
                names = list(self._to_load)
            self._to_load.clear()
            if not names:
                continue
            try:
                async with asyncio.timeout(1.0):
                    await self._load(redis, names)
            except (RedisError, OSError, TimeoutError) as exc:
                _log.debug("stability_sync_failed", error=repr(exc))

    async def _load(self, redis: Redis, names: list[str]) -> None:
        hour = int(time.time()) // HOUR_S
        keys = [key for name in names for key in (_key(name, hour), _key(name, hour - 1))]
        # Per template its two hours' counts, summed in Redis (gateway.store.fold).
        _, by_template = await fold(redis, keys, [i // 2 for i in range(len(keys))], "whole", total=False)
        for i, name in enumerate(names):
            merged = by_template.get(i, {})
            n = merged.pop(COUNT_FIELD, 0)
            counts = self._templates.get(name)
            if counts is not None:
                counts.loaded_at_calls = counts.calls
                if n >= counts.n:
                    counts.n, counts.lines, counts.fresh = n, merged, True
