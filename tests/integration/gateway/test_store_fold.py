"""Counter hashes summed in a real Redis (gateway.store.fold): what the dashboard and the
cache report read, checked against the same sums done in Python."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest
import redis

from gateway.store import connect
from gateway.store import fold as fold_module
from gateway.store.fold import FIRST_CHUNK, fold


@pytest.mark.parametrize("fields_per_call", [fold_module.FIELDS_PER_CALL, 25])
def test_fold_sums_fields_and_groups_per_point_across_chunks(
    redis_url: str, fields_per_call: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several round trips: the first of ``FIRST_CHUNK`` hashes, the next as many as hold
    about ``fields_per_call`` fields (25: two or three of these 10-field hashes)."""
    monkeypatch.setattr(fold_module, "FIELDS_PER_CALL", fields_per_call)
    sync = redis.Redis.from_url(redis_url)
    sync.flushdb()
    rnd = random.Random(7)
    minutes = FIRST_CHUNK * 4 + 5
    keys = [f"t:fold:{m}" for m in range(minutes)]
    points = [m // 4 for m in range(minutes)]
    fields = [
        f"{dep}|{key}|{metric}"
        for dep in ("fast", "strong")
        for key in ("key_a", 'key "b"', "key_é")  # JSON escapes and UTF-8 survive the trip
        for metric in ("requests", "h:e2e:103", "tier:fast")
    ]
    want_total: dict[str, int] = defaultdict(int)
    want_last: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    want_first_last: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    want_whole: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for key, point in zip(keys, points, strict=True):
        counts = {f: rnd.randint(1, 1_000) for f in rnd.sample(fields, 10)}
        sync.hset(key, mapping=counts)  # type: ignore[arg-type]
        for field, value in counts.items():
            parts = field.split("|")
            want_total[field] += value
            want_last[point][parts[-1]] += value
            want_first_last[point][f"{parts[0]}|{parts[-1]}"] += value
            want_whole[point][field] += value
    # Beyond the 14 digits of Lua's JSON numbers, still exact.
    sync.hset(keys[0], "big|k|cost_nusd", 2**52 + 1)
    sync.hset(keys[1], "big|k|cost_nusd", 2**52 - 3)
    want_total["big|k|cost_nusd"] = 2**53 - 2
    want_last[0]["cost_nusd"] += 2**53 - 2
    want_first_last[0]["big|cost_nusd"] += 2**53 - 2
    want_whole[0]["big|k|cost_nusd"] += 2**53 - 2

    async def run() -> tuple[object, ...]:
        client = connect(redis_url)
        try:
            with_total = await fold(client, [*keys, "t:fold:absent"], [*points, 99], "first_last")
            last_only = await fold(client, keys, points, "last", total=False)
            whole = await fold(client, keys, points, "whole", total=False)
            assert await fold(client, keys) == (want_total, {})  # no points: no per-point sums
            return with_total, last_only, whole, await fold(client, [], [], "last")
        finally:
            await client.aclose()

    (total, by_point), (no_total, by_point_last), (_, by_point_whole), empty = asyncio.run(run())  # type: ignore[misc]
    assert total == want_total
    assert by_point == {p: dict(g) for p, g in want_first_last.items()}
    assert no_total == {}
    assert by_point_last == {p: dict(g) for p, g in want_last.items()}
    assert by_point_whole == {p: dict(g) for p, g in want_whole.items()}
    assert empty == ({}, {})
