"""The response cache's Redis stopped or frozen under it: requests go upstream as if the
cache were off, within the request path's Redis bound, and the cache comes back with Redis."""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import GatewayProcess, SimServer, sim_policy

POLICY_EXTRA = "cache: {enabled: true}\n"
LEASE_S = 1.5
"""How long a gateway's local view of the cache answers without a word from Redis."""
MESSAGES = [{"role": "user", "content": "the same question every time"}]


@pytest.fixture()
def own_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own (the shared one must not be stopped or frozen)."""
    server = EmbeddedRedis(supervise=False).start()
    try:
        yield server
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


@pytest.fixture()
def gateway(sim: SimServer, own_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        sim_policy(sim.base_url, POLICY_EXTRA),
        redis_url=own_redis.url,
        workdir=tmp_path,
        env={"SWITCHYARD_AUTH": "none"},
    )
    gw.start()
    yield gw
    gw.stop()
    assert "Traceback" not in gw.log_path.read_text()


def cached_chat(client: openai.OpenAI) -> str:
    raw = client.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES, temperature=0)  # type: ignore[arg-type]
    assert raw.parse().choices[0].message.content
    return raw.headers.get("x-switchyard-cache", "")


def timed(client: openai.OpenAI, count: int) -> tuple[list[float], list[str]]:
    took, outcomes = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        outcomes.append(cached_chat(client))
        took.append(time.perf_counter() - t0)
    return took, outcomes


def until_hit(client: openai.OpenAI) -> None:
    deadline = time.monotonic() + 10
    while cached_chat(client) != "hit":
        assert time.monotonic() < deadline, "the cache did not answer"
        time.sleep(0.05)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def test_a_frozen_redis_sends_requests_upstream_without_waiting_on_it(
    gateway: GatewayProcess, own_redis: EmbeddedRedis, sim: SimServer
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=10)
    until_hit(client)
    baseline, _ = timed(client, 40)
    assert own_redis.pid is not None
    calls = sim.stats()["requests_total"]
    os.kill(own_redis.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        frozen, outcomes = timed(client, 80)
        while time.monotonic() < stopped + LEASE_S + 0.5:  # past the local view's lease
            more, late = timed(client, 10)
            frozen += more
            outcomes += late
        late_frozen, late = timed(client, 40)
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    # The local view may answer from what it holds until it has heard nothing from Redis
    # for its lease (1.5 s); from then on, answered upstream, each request waiting Redis's
    # bound (50 ms) at most once a second: without the bound each would wait for the
    # client's socket timeout (1 s). The margin is for a loaded machine, not for the bound.
    assert set(late) == {"miss"}, [(o, round(t, 3)) for o, t in zip(late, late_frozen, strict=True)]
    assert set(outcomes) <= {"hit", "miss"}
    misses = (outcomes + late).count("miss")
    assert sim.stats()["requests_total"] == calls + misses
    frozen += late_frozen
    assert p99(frozen) < p99(baseline) + 0.25, (p99(baseline), p99(frozen), max(frozen))
    until_hit(client)


def test_a_stopped_redis_sends_requests_upstream_and_the_cache_comes_back(
    gateway: GatewayProcess, own_redis: EmbeddedRedis, sim: SimServer
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=10)
    until_hit(client)
    own_redis.stop()
    calls = sim.stats()["requests_total"]
    took, outcomes = timed(client, 20)
    assert "hit" not in outcomes and sim.stats()["requests_total"] == calls + 20
    assert max(took) < 1.0
    own_redis.start()
    until_hit(client)
