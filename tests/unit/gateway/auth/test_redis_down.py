"""Keys and rate limits while Redis does not answer: bounded waits, fail open as documented
(a key verified before keeps working, the limit admits), an unknown key is 503."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.auth.keys import PREFIX, KeyStore, _hash, record_key
from gateway.auth.limits import Limiter
from gateway.errors import RedisUnavailableError
from gateway.store.gate import RedisGate

KEY_ID = "0123456789ab"
SECRET = "s" * 43
TOKEN = f"{PREFIX}{KEY_ID}_{SECRET}"


class FrozenableRedis:
    """Answers HGETALL and the limiter's script until frozen; then never answers."""

    def __init__(self) -> None:
        self.frozen = False
        self.calls = 0
        salt = b"0" * 16
        self.records = {
            record_key(KEY_ID): {
                "name": "team",
                "salt": salt.hex(),
                "hash": _hash(salt, SECRET),
                "rpm": "100",
            }
        }

    async def _answer(self, value: Any) -> Any:
        self.calls += 1
        if self.frozen:
            await asyncio.sleep(3600)
        return value

    async def hgetall(self, key: str) -> dict[str, str]:
        return await self._answer(self.records.get(key, {}))

    def register_script(self, script: str) -> Any:
        async def run(keys: Any, args: Any) -> Any:
            return await self._answer([1, "ok", "99", "0", 0, "0"])

        return run


def _timed(coro: Any) -> tuple[Any, float]:
    async def run() -> tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            result = await coro
        except Exception as exc:  # returned for the test to check
            result = exc
        return result, time.perf_counter() - t0

    return asyncio.run(run())


def test_a_verified_key_keeps_working_and_stops_waiting_once_redis_is_known_frozen() -> None:
    redis = FrozenableRedis()
    gate = RedisGate(0.02, retry_s=60.0)
    keys = KeyStore(redis, cache_s=0.0, gate=gate)  # type: ignore[arg-type]

    async def run() -> list[float]:
        assert (await keys.verify(TOKEN)).key_id == KEY_ID
        redis.frozen = True
        waits = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert (await keys.verify(TOKEN)).name == "team"
            waits.append(time.perf_counter() - t0)
        return waits

    waits = asyncio.run(run())
    assert max(waits) < 0.5
    # One lookup found Redis frozen; the other 19 did not ask it again.
    assert redis.calls == 1 + 1 and gate.skipped_calls == 19
    assert sum(w > 0.015 for w in waits) == 1


def test_an_unknown_key_while_redis_is_down_is_503_auth_unavailable_never_401_or_a_pass() -> None:
    redis = FrozenableRedis()
    redis.frozen = True
    gate = RedisGate(0.02, retry_s=60.0)
    keys = KeyStore(redis, gate=gate)  # type: ignore[arg-type]
    for _ in range(2):
        err, waited_s = _timed(keys.verify(TOKEN))
        assert isinstance(err, RedisUnavailableError)
        assert err.status == 503 and err.code == "auth_unavailable" and waited_s < 0.5
    # Only Redis can say whether a key never seen is valid: each asks it, bounded.
    assert redis.calls == 2 and gate.unreachable


def test_the_rate_limit_admits_within_the_bound_while_redis_is_frozen() -> None:
    redis = FrozenableRedis()
    gate = RedisGate(0.02, retry_s=60.0)
    keys = KeyStore(redis, gate=gate)  # type: ignore[arg-type]
    limiter = Limiter(redis, writer=None, gate=gate)  # type: ignore[arg-type]

    async def run() -> list[Any]:
        record = await keys.verify(TOKEN)
        assert (await limiter.admit(record)).reason == "ok"
        redis.frozen = True
        return [await limiter.admit(record) for _ in range(5)]

    admissions, waited_s = _timed(run())
    assert [a.allowed for a in admissions] == [True] * 5
    assert {a.reason for a in admissions} == {"redis_unavailable"}
    assert limiter.errors == 5 and waited_s < 0.5
    assert gate.skipped_calls == 4  # only the first waited for Redis


@pytest.mark.parametrize("cached_s", [0.0, 10.0])
def test_a_key_cached_as_wrong_stays_wrong_while_redis_is_down(cached_s: float) -> None:
    from gateway.errors import AuthenticationError

    redis = FrozenableRedis()
    keys = KeyStore(redis, cache_s=cached_s, gate=RedisGate(0.02, open_after=1))  # type: ignore[arg-type]
    wrong = f"{PREFIX}{KEY_ID}_{'x' * 43}"

    async def run() -> None:
        with pytest.raises(AuthenticationError):
            await keys.verify(wrong)
        redis.frozen = True
        with pytest.raises(AuthenticationError):
            await keys.verify(wrong)

    asyncio.run(run())
