"""Stored Responses API responses (``store: true``): the response, its input items and the
whole conversation up to it, in Redis with a TTL, under the key that created them.

Replicas share them through Redis, so ``previous_response_id`` works whichever replica a
turn lands on. A key reads only its own: another key's id is as unknown as a missing one.
Redis errors become a 503 (``store_unavailable``): a request that needs stored state
cannot be answered without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.errors import NotFoundError, UpstreamUnavailableError

_PREFIX = "sy:resp:"


@dataclass(slots=True)
class StoredResponse:
    """A response as stored: the object, its input items, and the conversation (every item
    of the ``previous_response_id`` chain, this response's output included)."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]


def _key(owner: str | None, response_id: str) -> str:
    return f"{_PREFIX}{owner or '-'}:{response_id}"


def unavailable(exc: BaseException) -> UpstreamUnavailableError:
    """The 503 a stateful request gets when Redis cannot be reached."""
    return UpstreamUnavailableError(
        f"Stored responses are unavailable (Redis: {type(exc).__name__}); requests without "
        "previous_response_id still work.",
        code="store_unavailable",
    )


def not_found(response_id: str, param: str | None = None) -> NotFoundError:
    """OpenAI's 404 for an unknown (or another key's) response id."""
    return NotFoundError(
        f"Response with id '{response_id}' not found.", param=param, code="response_not_found"
    )


class ResponseStore:
    """Stored responses in Redis, per key."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def save(self, owner: str | None, stored: StoredResponse, ttl_s: float) -> None:
        """Keep ``stored`` for ``ttl_s`` seconds (raises the 503 when Redis fails)."""
        data = orjson.dumps(
            {
                "response": stored.response,
                "input_items": stored.input_items,
                "conversation": stored.conversation,
            }
        )
        try:
            await self._redis.set(_key(owner, stored.response["id"]), data, px=max(1, int(ttl_s * 1000)))
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from None

    async def load(self, owner: str | None, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response ``response_id`` of ``owner``; 404 when missing or not its own."""
        try:
            data = await self._redis.get(_key(owner, response_id))
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from None
        if data is None:
            raise not_found(response_id, param)
        obj = orjson.loads(data)
        return StoredResponse(obj["response"], obj["input_items"], obj["conversation"])

    async def delete(self, owner: str | None, response_id: str) -> None:
        """Forget ``response_id``; 404 when missing or not ``owner``'s."""
        try:
            deleted = await self._redis.delete(_key(owner, response_id))
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from None
        if not deleted:
            raise not_found(response_id)
