"""Per-key rate limits shared by two gateway processes on one Redis, and budgets."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]
ENV = {"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}


@pytest.fixture()
def pair(sim: SimServer, make_gateway: Any) -> tuple[GatewayProcess, GatewayProcess]:
    """Two replicas sharing one Redis (the second does not flush it)."""
    first = make_gateway(sim_policy(sim.base_url), env=ENV)
    second = make_gateway(sim_policy(sim.base_url), env=ENV, flush_redis=False)
    return first, second


def sdk(gw: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=10)


def test_rpm_is_shared_across_replicas_with_openai_headers(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    _, made = admin(pair[0], "POST", "/admin/keys", {"name": "rpm4", "rpm": 4})
    clients = [sdk(gw, made["key"]) for gw in pair]
    remaining = []
    for i in range(4):
        raw = clients[i % 2].chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
        assert raw.headers["x-ratelimit-limit-requests"] == "4"
        remaining.append(int(raw.headers["x-ratelimit-remaining-requests"]))
        assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    assert remaining == [3, 2, 1, 0]
    for c in clients:
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
        err = info.value
        assert err.status_code == 429 and err.code == "rate_limit_exceeded"
        # One request refills in 15 s at 4 per minute.
        assert 1 <= int(err.response.headers["retry-after"]) <= 15
        assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert err.response.headers["x-should-retry"] == "false"
        assert "rpm4" in err.message and "requests per minute" in err.message
    # Another key is not affected.
    _, other = admin(pair[1], "POST", "/admin/keys", {"name": "other", "rpm": 4})
    assert sdk(pair[1], other["key"]).chat.completions.create(model="fast", messages=MESSAGES).choices  # type: ignore[arg-type]


def test_tpm_counts_a_stream_when_it_ends(pair: tuple[GatewayProcess, GatewayProcess]) -> None:
    _, made = admin(pair[0], "POST", "/admin/keys", {"name": "tpm", "tpm": 20})
    first, second = (sdk(gw, made["key"]) for gw in pair)
    raw = first.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
        model="fast", messages=MESSAGES, stream=True, max_tokens=100, stream_options={"include_usage": True}
    )
    assert raw.headers["x-ratelimit-limit-tokens"] == "20"
    assert raw.headers["x-ratelimit-remaining-tokens"] == "20"
    chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens > 20
    # The stream's tokens are charged when it ends; the other replica then refuses.
    deadline = time.monotonic() + 3
    while True:
        try:
            second.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
        except openai.RateLimitError as exc:
            assert exc.code == "rate_limit_exceeded" and "tokens per minute" in exc.message
            assert exc.response.headers["x-ratelimit-remaining-tokens"] == "0"
            assert int(exc.response.headers["retry-after"]) >= 1
            break
        assert time.monotonic() < deadline, "tokens of the stream were never charged"
        time.sleep(0.1)


def test_a_key_past_its_budget_gets_insufficient_quota(sim: SimServer, make_gateway: Any) -> None:
    # 1,000 USD per million tokens: a request of a few dozen tokens costs a few cents.
    priced = sim_policy(sim.base_url).replace(
        '{provider: vllm, base_url: "' + sim.base_url + '"}',
        '{provider: vllm, base_url: "' + sim.base_url + '", price: {input: 1000, output: 1000}}',
    )
    gw = make_gateway(priced, env=ENV)
    _, made = admin(gw, "POST", "/admin/keys", {"name": "capped", "budget_usd": 0.1})
    c = sdk(gw, made["key"])
    spent = 0.0
    for _ in range(50):
        try:
            reply = c.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=20)  # type: ignore[arg-type]
        except openai.RateLimitError as exc:
            assert exc.status_code == 429 and exc.code == "insufficient_quota"
            assert "budget" in exc.message
            break
        assert reply.usage is not None
        spent += reply.usage.total_tokens * 1000 / 1e6
        time.sleep(0.15)  # the spend is charged off the request path
    else:
        raise AssertionError("budget never enforced")
    assert spent >= 0.1
    _, listing = admin(gw, "GET", "/admin/keys")
    row = next(r for r in listing["data"] if r["id"] == made["id"])
    assert row["spend_usd"] == pytest.approx(spent, rel=1e-6)


def test_buckets_refill_and_a_long_answer_takes_the_token_bucket_below_zero(redis_url: str) -> None:
    import asyncio

    from gateway.auth.keys import KeyRecord
    from gateway.auth.limits import Limiter
    from gateway.errors import RateLimitError
    from gateway.store import connect
    from gateway.store.writer import StatsWriter

    async def main() -> None:
        client = connect(redis_url)
        writer = StatsWriter(client)
        limiter = Limiter(client, writer)
        # 120 a minute: two a second.
        key = KeyRecord(key_id=f"{int(time.time() * 1000) % 16**12:012x}", name="refill", rpm=120, tpm=600)
        for _ in range(120):
            await limiter.admit(key)
        with pytest.raises(RateLimitError) as info:
            await limiter.admit(key)
        assert info.value.retry_after_s is not None and 0 < info.value.retry_after_s <= 0.5
        await asyncio.sleep(0.6)
        admitted = await limiter.admit(key)  # one request refilled
        assert admitted.headers["x-ratelimit-remaining-requests"] == "0"

        limiter.charge(key, 900, 0)  # 300 over the bucket
        await writer.flush()
        with pytest.raises(RateLimitError) as tokens:
            await limiter.admit(key)
        # 301 tokens short at 10 a second: about 30 s.
        assert tokens.value.retry_after_s is not None and 29 < tokens.value.retry_after_s <= 31
        assert "tokens per minute" in tokens.value.message
        await client.aclose()

    asyncio.run(main())


def test_a_budgeted_keys_spend_is_in_redis_before_the_next_stats_batch(redis_url: str) -> None:
    """Every gateway checks a budget against the spend in Redis: a charge left for the next
    stats batch (0.1 s) let three gateways admit a batch's worth of requests past it."""
    import asyncio

    from gateway.auth.keys import KeyRecord
    from gateway.auth.limits import Limiter
    from gateway.errors import RateLimitError
    from gateway.store import connect
    from gateway.store.writer import StatsWriter

    async def main() -> None:
        client = connect(redis_url)
        writer = StatsWriter(client)  # never flushed here: the charge must not wait for it
        limiter = Limiter(client, writer)
        key = KeyRecord(key_id=f"{time.time_ns() % 16**12:012x}", name="budget", budget_usd=0.001)
        await limiter.admit(key)
        limiter.charge(key, 0, 1_000_000)  # $0.001: the whole budget
        for _ in range(100):
            if (await limiter.spend_usd([key.key_id]))[key.key_id] > 0:
                break
            await asyncio.sleep(0.005)
        with pytest.raises(RateLimitError) as refused:
            await limiter.admit(key)
        assert refused.value.code == "insufficient_quota"
        assert limiter.charges_dropped == 0
        await client.aclose()

    asyncio.run(main())
