"""``switchyard cache list | inspect | purge``: the response cache's entries, straight in Redis.

Entries are read with ``SCAN`` (never ``KEYS``, which blocks Redis for every other
client while it walks the whole keyspace). Like ``switchyard keys``, the commands need the
gateway's ``REDIS_URL`` (or ``--redis-url``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from redis.asyncio import Redis

from gateway.cache.entry import CorruptEntry, decode
from gateway.cache.key import PREFIX
from gateway.store import connect

_SCAN_COUNT = 500


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="list, inspect and purge response cache entries")
    csub = p.add_subparsers(dest="cache_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--redis-url", help="the gateway's Redis (REDIS_URL)")

    listing = csub.add_parser("list", help="entries with their namespace, size, TTL left and deployment")
    listing.add_argument("--namespace", help="only this namespace (a shared one, or k:<key id>)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    common(listing)
    listing.set_defaults(func=lambda a: _run(a, _list))
    inspect = csub.add_parser("inspect", help="one entry: its header and the stored answer")
    inspect.add_argument("entry", help="the entry's id (as list shows it) or its Redis key")
    common(inspect)
    inspect.set_defaults(func=lambda a: _run(a, _inspect))
    purge = csub.add_parser("purge", help="delete a namespace's entries, or those a key stored")
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--namespace", help="every entry of this namespace")
    which.add_argument("--key", dest="key_id", help="every entry this virtual key id stored")
    which.add_argument("--all", action="store_true", help="every entry")
    common(purge)
    purge.set_defaults(func=lambda a: _run(a, _purge))


def _run(args: argparse.Namespace, command: Callable[[argparse.Namespace, Redis], Awaitable[int]]) -> int:
    url = args.redis_url or os.environ.get("REDIS_URL") or os.environ.get("SWITCHYARD_REDIS_URL")
    if not url:
        print(
            "switchyard cache: needs the gateway's Redis: set REDIS_URL or pass --redis-url", file=sys.stderr
        )
        return 2

    async def main() -> int:
        redis = connect(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        try:
            return await command(args, redis)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(main())
    except (OSError, ConnectionError) as exc:
        print(f"switchyard cache: cannot reach Redis at the given URL: {exc}", file=sys.stderr)
        return 1


async def scan_entries(redis: Redis, namespace: str | None = None) -> AsyncIterator[str]:
    """The Redis keys of the entries (of ``namespace``), by ``SCAN``."""
    match = f"{PREFIX}{namespace}:*" if namespace else f"{PREFIX}*"
    async for raw in redis.scan_iter(match=match, count=_SCAN_COUNT):
        yield raw.decode() if isinstance(raw, bytes) else str(raw)


def _split(key: str) -> tuple[str, str]:
    namespace, _, entry_id = key[len(PREFIX) :].rpartition(":")
    return namespace, entry_id


async def _get(redis: Redis, key: str) -> bytes | None:
    data = await redis.get(key)
    return data if isinstance(data, bytes) else None


def _head(data: bytes) -> dict[str, Any]:
    try:
        head = orjson.loads(data.partition(b"\n")[0])
    except orjson.JSONDecodeError:
        return {}
    return head if isinstance(head, dict) else {}


async def _list(args: argparse.Namespace, redis: Redis) -> int:
    rows: list[dict[str, Any]] = []
    async for key in scan_entries(redis, args.namespace):
        if len(rows) >= args.limit:
            break
        data, ttl_ms = await _get(redis, key), await redis.pttl(key)
        if data is None:
            continue
        namespace, entry_id = _split(key)
        head = _head(data)
        rows.append(
            {
                "id": entry_id,
                "namespace": namespace,
                "kind": head.get("kind"),
                "deployment": head.get("deployment"),
                "key_id": head.get("key_id"),
                "bytes": len(data),
                "ttl_s": round(ttl_ms / 1000, 1) if ttl_ms and ttl_ms > 0 else None,
                "created_at": head.get("created_at"),
            }
        )
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(rows) + b"\n")
        return 0
    info = await redis.info("stats")
    if isinstance(info, dict) and "evicted_keys" in info:
        # Redis's own counts (all keys, the cache's among them): the gateway evicts nothing.
        evicted, expired = info["evicted_keys"], info.get("expired_keys", 0)
        print(f"Redis since its start: {evicted} keys evicted, {expired} expired")
    title = f"{'ID':<32}  {'NAMESPACE':<18}  {'KIND':<9}  {'DEPLOYMENT':<16}  {'BYTES':>8}  {'TTL S':>8}"
    print(title + "  STORED (UTC)")
    for row in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row["created_at"] or 0))
        ttl = f"{row['ttl_s']:.0f}" if row["ttl_s"] is not None else "-"
        print(
            f"{row['id']:<32}  {row['namespace'][:18]:<18}  {row['kind'] or '?':<9}  "
            f"{(row['deployment'] or '?')[:16]:<16}  {row['bytes']:>8}  {ttl:>8}  {created}"
        )
    return 0


async def _find(redis: Redis, entry: str) -> str | None:
    if entry.startswith(PREFIX):
        return entry
    async for key in scan_entries(redis):
        if key.endswith(":" + entry):
            return key
    return None


async def _inspect(args: argparse.Namespace, redis: Redis) -> int:
    key = await _find(redis, args.entry)
    data = await _get(redis, key) if key is not None else None
    if key is None or data is None:
        print(f"switchyard cache: no entry '{args.entry}'", file=sys.stderr)
        return 1
    head = _head(data)
    try:
        answer: Any = decode(data, str(head.get("kind"))).answer()
    except CorruptEntry as exc:
        answer = f"(corrupt: {exc}; the gateway deletes it on its next lookup)"
    namespace, entry_id = _split(key)
    out = {"id": entry_id, "namespace": namespace, "ttl_ms": await redis.pttl(key), **head, "answer": answer}
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


async def _purge(args: argparse.Namespace, redis: Redis) -> int:
    deleted = 0
    batch: list[str] = []
    async for key in scan_entries(redis, args.namespace):
        if args.key_id is not None:
            data = await _get(redis, key)
            if data is None or _head(data).get("key_id") != args.key_id:
                continue
        batch.append(key)
        if len(batch) >= _SCAN_COUNT:
            deleted += int(await redis.unlink(*batch))
            batch = []
    if batch:
        deleted += int(await redis.unlink(*batch))
    print(f"deleted {deleted} entries")
    return 0
