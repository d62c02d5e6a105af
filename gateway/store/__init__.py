"""Redis: the connection every replica shares, and the embedded server for zero setup.

``connect`` takes ``redis://``, ``rediss://`` and ``unix://`` URLs for one server, and
``redis+cluster://`` / ``rediss+cluster://`` for a Redis Cluster (redis-py's
``RedisCluster``; the nodes after ``//`` are where discovery starts, e.g.
``redis+cluster://:pw@redis-0:6379,redis-1:6379``).

Cluster caveat for code that writes to Redis: a non-transactional pipeline may mix keys
of any slot (the client splits it per node, as ``StatsWriter`` relies on there), but
MULTI/EXEC, Lua scripts and multi-key commands (``MGET``, ``RENAME`` ...) need all their
keys in one slot: put the shared part of such keys in a ``{hash tag}`` (as the cache
expectations' script does, one call per deployment).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster

__all__ = ["CLUSTER_SCHEMES", "SCHEMES", "check_url", "connect", "display_url", "eval_each", "is_cluster_url"]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
"""The URL schemes :func:`connect` takes."""


def check_url(url: str) -> None:
    """Raise ValueError, with the fix in its message, when ``url`` is not a Redis URL
    :func:`connect` takes (the common slip: ``localhost:6379`` without ``redis://``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        shown = url if "@" not in url else "***@" + url.rpartition("@")[2]
        raise ValueError(
            f"REDIS_URL {shown!r} has no scheme: write redis://{shown} "
            "(or rediss://, unix:///path/to.sock, redis+cluster://)"
        )
    if scheme.lower() not in SCHEMES:
        raise ValueError(
            f"REDIS_URL {display_url(url)!r} has the scheme {scheme!r}: use one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    if not rest.strip("/"):
        raise ValueError(f"REDIS_URL {url!r} names no host or socket: e.g. redis://127.0.0.1:6379/0")


def display_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs and ``/readyz``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    netloc = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def connect(url: str, **options: Any) -> aioredis.Redis:
    """A client for ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://`` URLs.

    Timeouts are short on purpose: a slow Redis must cost a request nothing, so stats
    writes give up quickly and are counted as dropped.
    """
    options.setdefault("socket_timeout", 1.0)
    options.setdefault("socket_connect_timeout", 1.0)
    options.setdefault("health_check_interval", 15)
    if is_cluster_url(url):
        return _connect_cluster(url, **options)
    # A bounded pool that waits (up to a second) for a free connection: the default pool
    # raises MaxConnectionsError past 100 concurrent commands, which a burst of requests
    # (each checking its rate limit) reaches at once.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=options.pop("max_connections", 256),
        timeout=options.pop("pool_timeout_s", 1.0),
        **options,
    )
    return aioredis.Redis.from_pool(pool)


def _connect_cluster(url: str, **options: Any) -> aioredis.Redis:
    parts = urlsplit(url)
    auth, _, hosts = parts.netloc.rpartition("@")
    username, _, password = auth.partition(":")
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "6379"
        try:
            nodes.append(ClusterNode(host.strip("[]"), int(port or 6379)))
        except ValueError:
            raise ValueError(f"bad Redis Cluster node {item!r} in {parts.scheme}:// URL") from None
    if not nodes or not nodes[0].host:
        raise ValueError(f"a {parts.scheme}:// URL needs at least one host:port")
    if parts.path not in ("", "/", "/0"):
        raise ValueError("Redis Cluster has only database 0")
    cluster = RedisCluster(
        startup_nodes=nodes,
        username=unquote(username) or None,
        password=unquote(password) or None,
        ssl=parts.scheme.lower() == "rediss+cluster",
        **options,
    )
    # RedisCluster speaks the commands the gateway uses (pipelines, hashes, PING, ...);
    # it is typed as a Redis client so the stores need no union.
    return cast(aioredis.Redis, cluster)


async def eval_each(
    redis: aioredis.Redis, script: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """The replies of ``script`` run once per ``(keys, args)`` of ``calls``: one EVAL for one
    call (a pipeline of one costs more than the command), else one pipeline (on a Redis
    Cluster the client sends each call to the node of its keys' slot)."""
    if len(calls) == 1:
        [(keys, args)] = calls
        return [await redis.eval(script, len(keys), *keys, *args)]
    if not calls:
        return []
    pipe = redis.pipeline(transaction=False)
    for keys, args in calls:
        pipe.eval(script, len(keys), *keys, *args)
    return list(await pipe.execute())
