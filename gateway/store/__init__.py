"""Redis: the connection every replica shares, and the embedded server for zero setup."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

__all__ = ["connect"]


def connect(url: str, **options: Any) -> aioredis.Redis:
    """A client for ``redis://``, ``rediss://`` or ``unix://`` URLs.

    Timeouts are short on purpose: a slow Redis must cost a request nothing, so stats
    writes give up quickly and are counted as dropped.
    """
    options.setdefault("socket_timeout", 1.0)
    options.setdefault("socket_connect_timeout", 1.0)
    options.setdefault("health_check_interval", 15)
    client: aioredis.Redis = aioredis.from_url(url, **options)
    return client
