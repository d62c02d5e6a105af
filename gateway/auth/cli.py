"""``switchyard keys create | list | revoke``: manage virtual keys straight in Redis.

The gateway reads keys from the Redis its replicas share, so these commands need the
same ``REDIS_URL`` (or ``--redis-url``). A gateway on the embedded Redis (no
``REDIS_URL``) has its keys managed through ``/admin/keys`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.auth.keys import KeyStore, validate_new_key
from gateway.auth.limits import Limiter
from gateway.errors import SwitchyardError
from gateway.store import connect, display_url
from gateway.store.gate import REDIS_FAULTS
from gateway.store.writer import StatsWriter


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="create, list and revoke virtual keys")
    ksub = p.add_subparsers(dest="keys_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--redis-url", help="the gateway's Redis (REDIS_URL)")

    create = ksub.add_parser("create", help="create a key and print its secret (shown only this once)")
    create.add_argument("--name", required=True, help="who the key is for, e.g. team-a")
    create.add_argument("--rpm", type=int, help="requests per minute (default: unlimited)")
    create.add_argument("--tpm", type=int, help="tokens per minute, prompt + completion (default: unlimited)")
    create.add_argument("--budget-usd", type=float, help="refuse requests once this much is spent")
    create.add_argument("--models", help="comma-separated model names the key may use (default: any)")
    create.add_argument("--json", action="store_true", help="print the key as JSON")
    common(create)
    create.set_defaults(func=lambda a: _run(a, _create))
    listing = ksub.add_parser("list", help="list keys with their limits and spend (never the secrets)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    common(listing)
    listing.set_defaults(func=lambda a: _run(a, _list))
    revoke = ksub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    common(revoke)
    revoke.set_defaults(func=lambda a: _run(a, _revoke))


def _run(
    args: argparse.Namespace, command: Callable[[argparse.Namespace, KeyStore, Limiter], Awaitable[int]]
) -> int:
    url = args.redis_url or os.environ.get("REDIS_URL") or os.environ.get("SWITCHYARD_REDIS_URL")
    if not url:
        print(
            "switchyard keys: needs the gateway's Redis: set REDIS_URL or pass --redis-url "
            "(a gateway on the embedded Redis manages keys through POST /admin/keys)",
            file=sys.stderr,
        )
        return 2

    async def main() -> int:
        redis = connect(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        try:
            return await command(args, KeyStore(redis), Limiter(redis, StatsWriter(redis)))
        finally:
            await redis.aclose()

    try:
        return asyncio.run(main())
    except SwitchyardError as exc:
        print(f"switchyard keys: {exc.message}", file=sys.stderr)
        return 2
    except REDIS_FAULTS as exc:
        print(
            f"switchyard keys: cannot reach Redis at {display_url(url)} ({type(exc).__name__}): "
            "check REDIS_URL / --redis-url and that the server is running",
            file=sys.stderr,
        )
        return 1


async def _create(args: argparse.Namespace, store: KeyStore, limiter: Limiter) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    name, rpm, tpm, budget, names = validate_new_key(args.name, args.rpm, args.tpm, args.budget_usd, models)
    secret, record = await store.create(name, rpm=rpm, tpm=tpm, budget_usd=budget, models=names)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps({"key": secret, **record.public()}) + b"\n")
        return 0
    print(secret)
    print(f"id {record.key_id}, name {record.name}: {_limits(record.public())}", file=sys.stderr)
    print("Store the key now: it is not shown again (only a salted hash is kept).", file=sys.stderr)
    return 0


def _limits(row: dict[str, Any]) -> str:
    parts = [f"{name} {row[name]}" for name in ("rpm", "tpm") if row[name]]
    if row["budget_usd"]:
        parts.append(f"budget ${row['budget_usd']:g}")
    if row["models"]:
        parts.append("models " + ",".join(row["models"]))
    return ", ".join(parts) or "no limits"


async def _list(args: argparse.Namespace, store: KeyStore, limiter: Limiter) -> int:
    records = await store.list()
    spend = await limiter.spend_usd([r.key_id for r in records])
    rows = [{**r.public(), "spend_usd": round(spend[r.key_id], 9)} for r in records]
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(rows) + b"\n")
        return 0
    print(f"{'ID':<12}  {'NAME':<20}  {'STATUS':<8}  {'SPEND USD':>10}  {'CREATED (UTC)':<16}  LIMITS")
    for row in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row["created_at"]))
        status = "revoked" if row["revoked"] else "active"
        print(
            f"{row['id']:<12}  {row['name'][:20]:<20}  {status:<8}  {row['spend_usd']:>10.4f}  "
            f"{created:<16}  {_limits(row)}"
        )
    return 0


async def _revoke(args: argparse.Namespace, store: KeyStore, limiter: Limiter) -> int:
    record = await store.revoke(args.key_id)
    if record is None:
        print(f"switchyard keys: no key with id '{args.key_id}'", file=sys.stderr)
        return 1
    print(f"revoked {record.key_id} ({record.name})")
    return 0
