"""Virtual keys: created once, stored in Redis only as a salted hash, verified in constant time.

A key reads ``sk-sy-<key id>_<secret>``. The key id (12 hex digits) names the Redis hash
``sy:key:{<key id>}`` holding the key's name, salt, ``sha256(salt + secret)`` and limits;
the secret (32 random bytes) is shown once, at creation, and never stored. A plain salted
SHA-256 is enough here: the secret is random with 256 bits of entropy, so there is no
dictionary to slow down (the same reasoning as GitHub's and Stripe's tokens).

Verification looks the id up, hashes the given secret and compares with
:func:`hmac.compare_digest`. Verified keys are kept in process for ``cache_s`` seconds, so
a request costs one dictionary lookup. Keys and tokens that are not keys are cached apart,
each bounded and evicting the least recently used: a flood of distinct bogus tokens only
churns the small negative cache and never pushes a valid key out (each bogus token still
costs its one Redis lookup, as it must). A revocation is also written to a sorted set that
every replica polls once a second (:meth:`KeyStore.watch_revocations`), so a revoked key
stops working everywhere within about a second (at once on the replica that revoked it;
within ``cache_s`` at worst, when Redis cannot be read).

Redis on the request path is bounded by a :class:`~gateway.store.gate.RedisGate` (a few
tens of milliseconds). When Redis does not answer in time, a key verified in the last
``stale_s`` seconds keeps working (a Redis outage must not lock every client out), and
while the gate counts Redis unreachable such a key is served without asking it at all. A
key not verified before cannot be checked without Redis: it still asks (within the same
bound) and, when Redis does not answer, gets 503 ``auth_unavailable``, never a 401 (it may
well be valid) and never a pass (it may well not be).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.errors import AuthenticationError, InvalidRequestError, RedisUnavailableError
from gateway.store.gate import REDIS_FAULTS, RedisGate

PREFIX = "sk-sy-"
INDEX = "sy:keys"
REVOKED = "sy:keys:revoked"
"""A sorted set: key id -> when it was revoked; every replica polls it to drop its cache."""
_ID_HEX = 12


def record_key(key_id: str) -> str:
    """The Redis hash of one key (hash-tagged: the limiter's keys share its slot)."""
    return f"sy:key:{{{key_id}}}"


def _hash(salt: bytes, secret: str) -> str:
    return hashlib.sha256(salt + secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What the gateway knows about one virtual key (never its secret)."""

    key_id: str
    name: str
    rpm: int = 0
    """Requests per minute; 0 is unlimited."""
    tpm: int = 0
    """Tokens (prompt + completion) per minute; 0 is unlimited."""
    budget_usd: float = 0.0
    """Spend after which requests are refused; 0 is no budget."""
    models: frozenset[str] = frozenset()
    """Model names the key may ask for (a tier, alias or deployment); empty is any."""
    created_at: float = 0.0
    revoked_at: float = 0.0

    @property
    def limited(self) -> bool:
        return bool(self.rpm or self.tpm or self.budget_usd)

    def allows(self, *names: str | None) -> bool:
        """Whether any of ``names`` (the requested model, its tier) is one the key may use."""
        return not self.models or any(n in self.models for n in names if n)

    def public(self) -> dict[str, Any]:
        """The key as the admin API and ``keys list`` show it: no secret, no hash."""
        return {
            "id": self.key_id,
            "name": self.name,
            "rpm": self.rpm or None,
            "tpm": self.tpm or None,
            "budget_usd": self.budget_usd or None,
            "models": sorted(self.models) or None,
            "created_at": self.created_at,
            "revoked": bool(self.revoked_at),
            "revoked_at": self.revoked_at or None,
        }


def _decode(raw: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in raw.items()
    }


def _record(key_id: str, fields: dict[str, str]) -> KeyRecord:
    models = fields.get("models", "")
    return KeyRecord(
        key_id=key_id,
        name=fields.get("name", ""),
        rpm=int(fields.get("rpm") or 0),
        tpm=int(fields.get("tpm") or 0),
        budget_usd=float(fields.get("budget_usd") or 0),
        models=frozenset(m for m in models.split(",") if m),
        created_at=float(fields.get("created_at") or 0),
        revoked_at=float(fields.get("revoked_at") or 0),
    )


def split_token(token: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed key, else None."""
    if not token.startswith(PREFIX):
        return None
    key_id, sep, secret = token[len(PREFIX) :].partition("_")
    # A header's bytes that are not UTF-8 read as lone surrogates: no key of ours has them.
    if not sep or len(key_id) != _ID_HEX or not secret or len(secret) > 128 or not secret.isascii():
        return None
    try:
        int(key_id, 16)
    except ValueError:
        return None
    return key_id, secret


def _limit(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"'{name}' must be a whole number >= 0.", param=name, code="invalid_value")
    return value


def validate_new_key(
    name: Any, rpm: Any = None, tpm: Any = None, budget_usd: Any = None, models: Any = None
) -> tuple[str, int, int, float, list[str]]:
    """Check the fields of a key to create; :class:`InvalidRequestError` names a bad one."""
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        raise InvalidRequestError("'name' must be a string of 1 to 128 characters.", param="name")
    budget = 0.0
    if budget_usd is not None:
        if isinstance(budget_usd, bool) or not isinstance(budget_usd, int | float) or budget_usd < 0:
            raise InvalidRequestError("'budget_usd' must be a number >= 0.", param="budget_usd")
        budget = float(budget_usd)
    names: list[str] = []
    if models is not None:
        if not isinstance(models, list) or not all(isinstance(m, str) and m and "," not in m for m in models):
            raise InvalidRequestError("'models' must be a list of model names.", param="models")
        names = models
    return name, _limit(rpm, "rpm"), _limit(tpm, "tpm"), budget, names


_Entry = tuple[float, KeyRecord | None]
"""A cached verification: when it was made, and the record (None: not a key)."""


class _LRU:
    """A bounded map of token -> verification that evicts the least recently used entry."""

    __slots__ = ("_entries", "evictions", "max_entries")

    def __init__(self, max_entries: int) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.max_entries = max_entries
        self.evictions = 0

    def get(self, token: str) -> _Entry | None:
        entry = self._entries.get(token)
        if entry is not None:
            self._entries.move_to_end(token)
        return entry

    def put(self, token: str, entry: _Entry) -> None:
        self._entries[token] = entry
        self._entries.move_to_end(token)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1

    def pop(self, token: str) -> None:
        self._entries.pop(token, None)

    def drop_prefix(self, prefix: str) -> None:
        for token in [t for t in self._entries if t.startswith(prefix)]:
            del self._entries[token]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(slots=True)
class KeyCacheStats:
    """What the key cache did since start: answers from memory, Redis lookups, evictions."""

    hits: int = 0
    negative_hits: int = 0
    lookups: int = 0


class KeyStore:
    """Create, list, revoke and verify virtual keys in Redis.

    Verifications are cached in two bounded LRU maps: ``max_cached_keys`` tokens that are
    keys (valid or revoked) and ``max_cached_invalid`` tokens that are not; the second is
    small, so tokens nobody was given cannot push out the keys clients use."""

    def __init__(
        self,
        redis: Redis,
        *,
        cache_s: float = 10.0,
        stale_s: float = 600.0,
        gate: RedisGate | None = None,
        max_cached_keys: int = 10_000,
        max_cached_invalid: int = 1_000,
    ) -> None:
        self._redis = redis
        self._gate = gate or RedisGate()
        self._cache_s = cache_s
        self._stale_s = stale_s
        self._keys = _LRU(max_cached_keys)
        self._invalid = _LRU(max_cached_invalid)
        self.stats = KeyCacheStats()
        # One Redis lookup per token at a time: a burst of a new key's requests shares it.
        self._lookups: dict[str, asyncio.Future[dict[str, str]]] = {}

    async def create(
        self,
        name: str,
        *,
        rpm: int = 0,
        tpm: int = 0,
        budget_usd: float = 0.0,
        models: Iterable[str] = (),
    ) -> tuple[str, KeyRecord]:
        """A new key: ``(the secret key, shown only now; its record)``."""
        key_id = secrets.token_hex(_ID_HEX // 2)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        record = KeyRecord(
            key_id=key_id,
            name=name,
            rpm=rpm,
            tpm=tpm,
            budget_usd=budget_usd,
            models=frozenset(models),
            created_at=time.time(),
        )
        fields: dict[str, str | int] = {
            "name": name,
            "salt": salt.hex(),
            "hash": _hash(salt, secret),
            "rpm": rpm,
            "tpm": tpm,
            "budget_usd": repr(budget_usd),
            "models": ",".join(sorted(record.models)),
            "created_at": repr(record.created_at),
            "revoked_at": 0,
        }
        await self._redis.hset(record_key(key_id), mapping=fields)  # type: ignore[arg-type]
        await self._redis.sadd(INDEX, key_id)
        return f"{PREFIX}{key_id}_{secret}", record

    async def get(self, key_id: str) -> KeyRecord | None:
        fields = _decode(await self._redis.hgetall(record_key(key_id)))
        return _record(key_id, fields) if fields else None

    async def list(self) -> list[KeyRecord]:
        """Every key, newest first."""
        ids = sorted(
            (i.decode() if isinstance(i, bytes) else str(i)) for i in await self._redis.smembers(INDEX)
        )
        pipe = self._redis.pipeline(transaction=False)
        for key_id in ids:
            pipe.hgetall(record_key(key_id))
        out = [_record(i, _decode(raw)) for i, raw in zip(ids, await pipe.execute(), strict=True) if raw]
        return sorted(out, key=lambda r: -r.created_at)

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Mark a key revoked (kept for the spend history); None when there is no such key."""
        if not await self._redis.exists(record_key(key_id)):
            return None
        now = time.time()
        await self._redis.hset(record_key(key_id), "revoked_at", repr(now))
        await self._redis.zadd(REVOKED, {key_id: now})
        self.forget(key_id)
        return await self.get(key_id)

    def forget(self, key_id: str) -> None:
        """Drop this key's cached verifications."""
        prefix = f"{PREFIX}{key_id}_"
        self._keys.drop_prefix(prefix)
        self._invalid.drop_prefix(prefix)

    def cache_stats(self) -> dict[str, int]:
        """The key cache's counters and sizes (for ``/admin/stats`` and tests)."""
        return {
            "hits": self.stats.hits,
            "negative_hits": self.stats.negative_hits,
            "lookups": self.stats.lookups,
            "keys_cached": len(self._keys),
            "invalid_cached": len(self._invalid),
            "keys_evicted": self._keys.evictions,
            "invalid_evicted": self._invalid.evictions,
        }

    async def watch_revocations(self, interval_s: float = 1.0) -> None:
        """Poll the revocations made by any replica and forget those keys. Runs until cancelled;
        a Redis that does not answer is tried again next time."""
        seen_until = time.time()
        while True:
            await asyncio.sleep(interval_s)
            try:
                async with asyncio.timeout(1.0):
                    # Look back a few seconds: the replicas' clocks differ a little.
                    found: list[Any] = await self._redis.zrangebyscore(
                        REVOKED, seen_until - 5.0, "+inf", withscores=True
                    )
            except REDIS_FAULTS:
                continue
            for raw, score in found:
                self.forget(raw.decode() if isinstance(raw, bytes) else str(raw))
                seen_until = max(seen_until, float(score))

    async def verify(self, token: str) -> KeyRecord:
        """The record of a valid, unrevoked key; :class:`AuthenticationError` otherwise."""
        now = time.monotonic()
        cached = self._keys.get(token) or self._invalid.get(token)
        if cached is not None and now - cached[0] < self._cache_s:
            if cached[1] is None:
                self.stats.negative_hits += 1
            else:
                self.stats.hits += 1
            return _accepted(cached[1])
        parts = split_token(token)
        if parts is None:
            raise _invalid()
        stale = cached is not None and now - cached[0] < self._stale_s
        if cached is not None and stale and self._gate.unreachable:
            # Redis failed moments ago: do not make every request wait for it again. (A
            # key never verified has no answer but Redis's: it still asks, bounded.)
            self._gate.skip()
            return _accepted(cached[1])
        try:
            fields = await self._lookup(token, parts[0])
        except REDIS_FAULTS:
            if cached is not None and stale:
                return _accepted(cached[1])
            raise _unavailable() from None
        record = None
        if fields and "salt" in fields:
            expected = fields.get("hash", "")
            given = _hash(bytes.fromhex(fields["salt"]), parts[1])
            if hmac.compare_digest(given.encode(), expected.encode()):
                record = _record(parts[0], fields)
        if record is None:
            self._keys.pop(token)  # a key deleted from Redis since
            self._invalid.put(token, (now, None))
        else:
            self._invalid.pop(token)
            self._keys.put(token, (now, record))
        return _accepted(record)

    async def _lookup(self, token: str, key_id: str) -> dict[str, str]:
        pending = self._lookups.get(token)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
        self._lookups[token] = future
        self.stats.lookups += 1
        try:
            fields = _decode(await self._gate.call(lambda: self._redis.hgetall(record_key(key_id))))
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else TimeoutError("lookup cancelled"))
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        else:
            future.set_result(fields)
            return fields
        finally:
            del self._lookups[token]


def _invalid() -> AuthenticationError:
    return AuthenticationError(
        "Incorrect API key provided. Create a key with `switchyard keys create` or POST /admin/keys."
    )


def _unavailable() -> RedisUnavailableError:
    return RedisUnavailableError(
        "This API key cannot be checked now: the gateway's Redis does not answer. Retry shortly.",
        code="auth_unavailable",
    )


def _accepted(record: KeyRecord | None) -> KeyRecord:
    if record is None:
        raise _invalid()
    if record.revoked_at:
        raise AuthenticationError("This API key has been revoked.", code="invalid_api_key")
    return record
