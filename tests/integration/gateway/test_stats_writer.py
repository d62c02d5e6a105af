"""The stats writer against a real Redis: a capped list keeps the newest values, newest
first, whatever the number pushed between two flushes, and expires."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway.store import connect
from gateway.store.writer import StatsWriter


def _add(writer: StatsWriter, key: str, field: str, amount: int, ttl_s: int, prefix: str = "") -> None:
    counters = writer.counters(key, prefix, ttl_s)
    counters[field] = counters.get(field, 0) + amount


def test_a_capped_list_keeps_the_newest_values_newest_first_across_flushes(redis_url: str) -> None:
    key = f"test:capped:{uuid.uuid4().hex}"

    async def main() -> tuple[list[bytes], list[bytes], int, int]:
        client = connect(redis_url)
        writer = StatsWriter(client)
        try:
            for i in range(3):
                writer.push(key, b"a%d" % i, 5, 60)
            await writer.flush()
            first = await client.lrange(key, 0, -1)
            # More than twice the cap between two flushes: the oldest are never sent.
            for i in range(12):
                writer.push(key, b"b%d" % i, 5, 60)
            await writer.flush()
            second = await client.lrange(key, 0, -1)
            return first, second, await client.ttl(key), writer.written + writer.dropped
        finally:
            await client.delete(key)
            await client.aclose()

    first, second, ttl_s, counted = asyncio.run(main())
    assert first == [b"a2", b"a1", b"a0"]
    assert second == [b"b11", b"b10", b"b9", b"b8", b"b7"]
    assert 0 < ttl_s <= 60
    assert counted == 15  # each value counted once, as written or as dropped


def test_one_flush_writes_every_counter_list_and_queued_command(redis_url: str) -> None:
    """Counters of several hashes, a list longer than the script pushes at once, and a queued
    command, in one flush: each lands as a pipeline of plain commands would have left it. A
    field's counts kept under a prefix and under its whole name are summed."""
    tag = uuid.uuid4().hex
    hashes = [f"test:h:{tag}:{i}" for i in range(3)]
    listed, queued = f"test:l:{tag}", f"test:q:{tag}"

    async def main() -> dict[str, Any]:
        client = connect(redis_url)
        writer = StatsWriter(client)
        try:
            for i, key in enumerate(hashes):
                for field in ("requests", "tokens"):
                    _add(writer, key, field, i + 1, 60 * (i + 1))
                writer.hincr_each(key, {"requests", "errors"}, 60 * (i + 1))
                _add(writer, key, "tokens", 10, 60 * (i + 1), prefix="d|k|")
                _add(writer, key, "d|k|tokens", 5, 60 * (i + 1))
            for i in range(2_400):
                writer.push(listed, b"v%d" % i, 2_500, 90)
            writer.add(lambda pipe: pipe.set(queued, b"yes", ex=30))
            await writer.flush()
            return {
                "hashes": [await client.hgetall(key) for key in hashes],
                "ttls": [await client.ttl(key) for key in hashes],
                "list": await client.lrange(listed, 0, -1),
                "list_ttl": await client.ttl(listed),
                "queued": await client.get(queued),
                "counted": (writer.written, writer.dropped),
            }
        finally:
            await client.delete(*hashes, listed, queued)
            await client.aclose()

    got = asyncio.run(main())
    assert got["hashes"] == [
        {
            b"requests": str(i + 2).encode(),
            b"tokens": str(i + 1).encode(),
            b"errors": b"1",
            b"d|k|tokens": b"15",
        }
        for i in range(3)
    ]
    assert all(60 * i < ttl <= 60 * (i + 1) for i, ttl in enumerate(got["ttls"]))
    assert got["list"] == [b"v%d" % i for i in reversed(range(2_400))]  # newest first, none lost
    assert 0 < got["list_ttl"] <= 90
    assert got["queued"] == b"yes"
    assert got["counted"] == (3 + 2_400 + 1, 0)


def test_a_key_redis_refuses_is_dropped_and_the_others_are_written(redis_url: str) -> None:
    tag = uuid.uuid4().hex
    taken, fine = f"test:taken:{tag}", f"test:fine:{tag}"

    async def main() -> tuple[object, object, int, int]:
        client = connect(redis_url)
        writer = StatsWriter(client)
        try:
            await client.set(taken, b"a string, not a hash")
            _add(writer, taken, "requests", 1, 60)
            _add(writer, fine, "requests", 1, 60)
            await writer.flush()
            return await client.get(taken), await client.hgetall(fine), writer.written, writer.dropped
        finally:
            await client.delete(taken, fine)
            await client.aclose()

    taken_value, fine_value, written, dropped = asyncio.run(main())
    assert taken_value == b"a string, not a hash"
    assert fine_value == {b"requests": b"1"}
    assert (written, dropped) == (1, 1)


def test_a_value_redis_py_cannot_encode_drops_its_flush_and_the_writer_goes_on(redis_url: str) -> None:
    """Text that is not UTF-8 (a lone surrogate, as a header of other bytes decodes to) fails
    the whole flush in redis-py: that flush is dropped and counted, and the next one lands."""
    key = f"test:after:{uuid.uuid4().hex}"

    async def main() -> tuple[object, int, int]:
        client = connect(redis_url)
        writer = StatsWriter(client)
        try:
            _add(writer, key, "lost", 1, 60, prefix="bad\udcff|")
            _add(writer, key, "lost", 1, 60)
            await writer.flush()
            _add(writer, key, "requests", 1, 60)
            await writer.flush()
            return await client.hgetall(key), writer.written, writer.dropped
        finally:
            await client.delete(key)
            await client.aclose()

    value, written, dropped = asyncio.run(main())
    assert value == {b"requests": b"1"}
    assert (written, dropped) == (1, 1)
