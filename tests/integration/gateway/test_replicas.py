"""Routing across vLLM replicas through the gateway: several simulators stand in for the replicas
(each its own prefix cache and /metrics), the official SDK is the client."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer, http_json, readyz

SYSTEMS = [
    f"You are assistant number {i}. " + "Follow the house style guide carefully. " * 30 for i in range(8)
]


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[SimServer]]:
    servers = [SimServer("--model", "llama:2:1", "--output-tokens", "4") for _ in range(3)]
    for server in servers:
        server.__enter__()
    yield servers
    for server in servers:
        server.__exit__()


@pytest.fixture()
def fresh(replicas: list[SimServer]) -> list[SimServer]:
    for server in replicas:
        server.reset()
    return replicas


def replica_policy(servers: list[SimServer], extra: str = "") -> str:
    urls = ", ".join(f'"{s.base_url}"' for s in servers)
    return f"""
deployments:
  local:
    provider: vllm
    model: llama
    replicas:
      urls: [{urls}]
      health_interval_s: 0.2
      metrics_interval_s: 0.2
{extra}
tiers:
  fast: [local]
"""


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def ask(c: openai.OpenAI, system: str, user: str, request_id: str) -> Any:
    return c.chat.completions.create(
        model="fast",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        extra_headers={"x-request-id": request_id},
    )


def where_did_they_go(servers: list[SimServer]) -> dict[str, int]:
    """x-request-id -> index of the simulator that served it."""
    out = {}
    for index, server in enumerate(servers):
        for entry in server.stats()["recent"]:
            out[entry["x-request-id"]] = index
    return out


def most_at_once(server: SimServer) -> int:
    """The most requests a simulator held at one time (its clock, from ``recent``)."""
    edges = []
    for entry in server.stats()["recent"]:
        start = entry["started_at"]
        edges += [(start, 1), (start + entry["duration_ms"] / 1000.0, -1)]
    most = now = 0
    for _, step in sorted(edges):  # at a tie an end (-1) sorts first
        now += step
        most = max(most, now)
    return most


def wait_ready(gw: GatewayProcess, healthy: int, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body = readyz(gw.url)
        state = body["replicas"].get("local", {})
        if state.get("healthy") == healthy:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def test_requests_that_share_a_system_prompt_stay_on_one_replica(
    fresh: list[SimServer], make_gateway: Any
) -> None:
    gw = make_gateway(replica_policy(fresh))
    wait_ready(gw, 3)
    with client(gw) as c:
        replies = {}
        for round_ in range(5):
            for p, system in enumerate(SYSTEMS):
                replies[f"p{p}-r{round_}"] = ask(c, system, f"question {round_} about {p}", f"p{p}-r{round_}")
    served = where_did_they_go(fresh)
    homes = {p: {served[f"p{p}-r{r}"] for r in range(5)} for p in range(len(SYSTEMS))}
    assert all(len(home) == 1 for home in homes.values()), homes  # each prefix kept its replica
    # and the prefixes spread over replicas (the ring follows the replicas' URLs, whose ports
    # vary by run: 8 prefixes all on one of 3 replicas is a 1-in-2,000 run, 4 were 1 in 30)
    assert len({next(iter(h)) for h in homes.values()}) >= 2
    for p in range(len(SYSTEMS)):
        for r in range(1, 5):  # after the first, every request found its prefix cached
            assert replies[f"p{p}-r{r}"].usage.prompt_tokens_details.cached_tokens > 0


def test_without_affinity_requests_go_to_the_least_loaded_replica(
    fresh: list[SimServer], make_gateway: Any
) -> None:
    # No scrape mid-test: a replica's scraped "running" count would weigh in its load.
    gw = make_gateway(replica_policy(fresh, "      prefix_affinity: false\n      metrics_interval_s: 30"))
    wait_ready(gw, 3)
    with client(gw) as c:
        for r in range(6):
            ask(c, SYSTEMS[0], f"q{r}", f"q{r}")
    served = where_did_they_go(fresh)
    assert Counter(served[f"q{r}"] for r in range(6)) == {0: 2, 1: 2, 2: 2}  # equal loads: rotated


def test_a_hot_prefix_spills_over_to_other_replicas_under_load(
    replicas: list[SimServer], make_gateway: Any
) -> None:
    slow = [SimServer("--model", "llama:5:25", "--output-tokens", "20") for _ in range(3)]
    for server in slow:
        server.__enter__()
    try:
        gw = make_gateway(replica_policy(slow, "      load_slack: 0\n      metrics_interval_s: 30"))
        wait_ready(gw, 3)
        with client(gw) as c, concurrent.futures.ThreadPoolExecutor(24) as pool:
            list(pool.map(lambda i: ask(c, SYSTEMS[1], f"q{i}", f"hot{i}"), range(24)))
        served = Counter(where_did_they_go(slow).values())
        assert len(served) >= 2, served  # not all on the prefix's home replica
        # The bound is on a replica's load (requests in flight), not on what it serves in all:
        # one that finishes early takes more. At most 24 in flight, so no replica ever held
        # more than ceil(1.25 x 24 / 3) = 10 at once.
        peaks = [most_at_once(server) for server in slow]
        assert max(peaks) <= 10, (peaks, served)
    finally:
        for server in slow:
            server.__exit__()


def test_a_replica_that_goes_down_is_routed_around(make_gateway: Any) -> None:
    servers = [SimServer("--model", "llama:2:1", "--output-tokens", "4") for _ in range(2)]
    for server in servers:
        server.__enter__()
    try:
        gw = make_gateway(replica_policy(servers))
        wait_ready(gw, 2)
        servers[0].__exit__()  # replica 0 dies; the gateway has not noticed yet
        with client(gw) as c:
            for i in range(8):
                assert ask(c, SYSTEMS[i % 4], "hi", f"d{i}").choices[0].message.content
        assert {entry["x-request-id"] for entry in servers[1].stats()["recent"]} >= {
            f"d{i}" for i in range(8)
        }
        # Marked down by a failed request, or by the next health probe (0.2 s) when no
        # prefix here had replica 0 as its home.
        status = wait_ready(gw, 1)
        assert status["replicas"]["local"] == {"ready": True, "healthy": 1, "replicas": 2}
        replicas = http_json("GET", gw.url + "/admin/replicas")["deployments"]["local"]["replicas"]
        assert [r["healthy"] for r in replicas] == [False, True]
        assert "cannot connect" in replicas[0]["last_error"]
    finally:
        servers[1].__exit__()


def test_no_healthy_replica_means_not_ready_and_a_clear_503(make_gateway: Any) -> None:
    from gateway.procutil import free_port

    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    policy = f"""
deployments:
  local:
    provider: vllm
    model: llama
    replicas: {{urls: {urls}, health_interval_s: 0.2}}
tiers: {{fast: [local]}}
""".replace("'", '"')
    gw = make_gateway(policy)
    body = wait_ready(gw, 0)
    # Its only deployment cannot answer: not ready (issue #50, item 12), and it says why.
    assert body["status"] == "not_ready"
    assert (
        "tier fast: no deployment has a healthy replica (local: 0 of 2 replicas answer /health)"
        in (body["problems"])
    )
    assert body["replicas"]["local"] == {"ready": False, "healthy": 0, "replicas": 2}
    with client(gw) as c, pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503
    assert info.value.code == "upstream_unavailable"
    # The client reads why in plain words; which deployment and the connect error are logged.
    assert info.value.message.endswith(
        "The deployment is not ready yet: 0 of 2 replicas answer /health; retry shortly."
    )
    line = gw.wait_log(lambda line: line.get("event") == "request" and line.get("status") == 503)
    assert (
        "deployment 'local' is not ready: 0 of 2 replicas answer /health (cannot connect"
        in line["error_detail"]
    )


def test_admin_replicas_shows_what_vllm_reports(fresh: list[SimServer], make_gateway: Any) -> None:
    gw = make_gateway(replica_policy(fresh))
    wait_ready(gw, 3)
    with client(gw) as c:
        for r in range(4):
            ask(c, SYSTEMS[2], f"q{r}", f"a{r}")
    deadline = time.monotonic() + 10
    while True:  # until a scrape taken after the fourth answer (one between them shows 3)
        status = http_json("GET", gw.url + "/admin/replicas")["deployments"]["local"]
        busy = [r for r in status["replicas"] if (r["metrics"] or {}).get("prefix_cache_hits_tokens")]
        if (
            busy
            and busy[0]["window"]
            and busy[0]["window"]["prefix_cache_hits_tokens"]
            and (busy[0]["metrics"]["ttft_count"] or 0) >= 4
        ):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    replica = busy[0]
    assert replica["routed"] == 4 and replica["routed_by"]["home"] == 4
    metrics = replica["metrics"]
    assert metrics["metric_names"]["prefix_cache_queries"] == "vllm:prefix_cache_queries_total"
    assert metrics["metric_names"]["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert 0 < metrics["prefix_cache_hit_rate"] < 1  # the first request missed, the others hit
    assert metrics["ttft_count"] == 4
    assert replica["window"]["prefix_cache_hit_rate"] > 0
    assert status["ready"] is True and status["healthy_replicas"] == 3 and status["prefix_cache_hit_rate"] > 0
    assert status["load_factor"] == 1.25 and status["load_slack"] == 4


def test_a_dated_system_prompt_keeps_its_home_replica(fresh: list[SimServer], make_gateway: Any) -> None:
    # The system prompt opens with the time, different on every request: the body's bytes
    # differ each time, but shaping moves the time to the end of the system message and the
    # replica follows the shaped stable prefix (before, 10 requests went to 2 or 3 replicas).
    gw = make_gateway(replica_policy(fresh))
    wait_ready(gw, 3)
    body = "Follow the house style guide carefully. " * 30
    with client(gw) as c:
        for r in range(10):
            system = f"Current time: 2026-12-07T12:{r:02d}:{r * 5 % 60:02d}Z\n{body}"
            ask(c, system, f"question {r}", f"d{r}")
    served = where_did_they_go(fresh)
    assert len({served[f"d{r}"] for r in range(10)}) == 1, served
