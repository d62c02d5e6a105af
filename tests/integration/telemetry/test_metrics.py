"""``GET /metrics`` after known traffic through a real gateway and the simulator: names, labels
and values, also summed over ``--workers 2``."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import GatewayProcess, SimServer

SHORT = [{"role": "user", "content": "Tell me about lighthouses."}]
# ~13 kB, ~3,400 simulator tokens (4 bytes each): lands in the 1k-4k prompt-size bucket.
LONG = [{"role": "user", "content": " ".join(f"word{i}" for i in range(1500))}]


@pytest.fixture(scope="module")
def msim() -> Iterator[SimServer]:
    with SimServer("--model", "a:5:1", "--model", "b:5:1") as server:
        yield server


def policy(sim: SimServer, dispatch: str = "") -> str:
    return f"""
deployments:
  a: {{base_url: "{sim.base_url}", price: {{input: 2.0, cached_input: 0.5, output: 8.0}}}}
  b: {{base_url: "{sim.base_url}"}}
tiers:
  fast: [a]
  strong: [b]
{dispatch}
"""


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    return sum(
        v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(dict(ls).items())
    )


def test_metrics_count_known_traffic_by_deployment_tier_stream_and_prompt_size(
    make_gateway: Any, msim: SimServer
) -> None:
    msim.reset()
    gw = make_gateway(policy(msim))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    usages = []
    for _ in range(3):
        usages.append(client.chat.completions.create(model="fast", messages=SHORT).usage)
    usages.append(client.chat.completions.create(model="fast", messages=LONG).usage)
    for _ in range(2):
        chunks = list(
            client.chat.completions.create(
                model="strong", messages=SHORT, stream=True, stream_options={"include_usage": True}
            )
        )
        assert chunks[-1].usage is not None
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=SHORT)
    for path in ("/v1/made-up-1", "/v1/made-up-2"):
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(urllib.request.Request(gw.url + path, data=b"{}"), timeout=5)
    time.sleep(0.2)  # the bookkeeping runs just after the response
    m = scrape(gw.url)

    ok = {"endpoint": "/v1/chat/completions", "status": "200", "error": ""}
    assert value(m, "switchyard_requests_total", deployment="a", tier="fast", **ok) == 4
    assert value(m, "switchyard_requests_total", deployment="b", tier="strong", **ok) == 2
    assert value(m, "switchyard_requests_total", status="404", error="model_not_found", deployment="") == 1
    # Unknown paths share one label value: clients cannot grow the label set.
    assert value(m, "switchyard_requests_total", endpoint="other", status="404") == 2
    assert not [
        ls for (n, ls) in m if n == "switchyard_requests_total" and ("endpoint", "/v1/made-up-1") in ls
    ]

    e2e = "switchyard_request_duration_seconds_count"
    assert value(m, e2e, deployment="a", tier="fast", stream="false", prompt_size="lt1k") == 3
    assert value(m, e2e, deployment="a", tier="fast", stream="false", prompt_size="1k_4k") == 1
    assert value(m, e2e, deployment="b", tier="strong", stream="true", prompt_size="lt1k") == 2
    # TTFT and inter-token latency exist for streams only, one observation per stream.
    assert value(m, "switchyard_time_to_first_token_seconds_count", deployment="b", stream="true") == 2
    assert value(m, "switchyard_time_to_first_token_seconds_count", deployment="a") == 0
    assert value(m, "switchyard_inter_token_latency_seconds_count", deployment="b") == 2
    ttft_sum = value(m, "switchyard_time_to_first_token_seconds_sum", deployment="b")
    assert 0.005 <= ttft_sum / 2 < 1.0  # the simulator's 5 ms TTFT, plus the gateway, well under a second
    le_inf = value(m, "switchyard_request_duration_seconds_bucket", deployment="a", le="+Inf")
    assert le_inf == 4

    prompt = sum(u.prompt_tokens for u in usages if u)
    cached = sum(
        (u.prompt_tokens_details.cached_tokens or 0) for u in usages if u and u.prompt_tokens_details
    )
    completion = sum(u.completion_tokens for u in usages if u)
    assert value(m, "switchyard_prompt_tokens_total", deployment="a") == prompt
    assert value(m, "switchyard_cached_tokens_total", deployment="a") == cached
    assert value(m, "switchyard_completion_tokens_total", deployment="a") == completion
    expected_cost = ((prompt - cached) * 2.0 + cached * 0.5 + completion * 8.0) / 1e6
    assert value(m, "switchyard_cost_usd_total", deployment="a") == pytest.approx(expected_cost)
    assert value(m, "switchyard_cost_usd_total", deployment="b") == 0  # no price, no cost


def test_retries_fallbacks_and_circuit_changes_are_counted(make_gateway: Any, msim: SimServer) -> None:
    msim.reset()
    dispatch = """dispatch:
  retries: {max: 1, backoff: {base_s: 0.01}}
  circuit: {consecutive_failures: 2, cooldown_s: 30}
  fallback: {fast: [strong]}
"""
    gw = make_gateway(policy(msim, dispatch))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    msim.set_fault("a", "error=500")
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(model="fast", messages=SHORT)
        assert raw.headers["x-switchyard-model"] == "b"
    time.sleep(0.2)
    m = scrape(gw.url)
    msim.clear_faults()
    assert value(m, "switchyard_retries_total") == 2
    assert value(m, "switchyard_fallbacks_total") == 2
    assert value(m, "switchyard_circuit_transitions_total", deployment="a", state="open") == 1
    assert value(m, "switchyard_circuit_state", deployment="a") == 2
    assert value(m, "switchyard_requests_total", deployment="b", tier="fast", status="200") == 2


def test_dropped_redis_writes_are_counted(make_gateway: Any, msim: SimServer, tmp_path: Any) -> None:
    with EmbeddedRedis() as redis_server:
        gw = GatewayProcess(policy(msim), redis_url=redis_server.url, workdir=tmp_path).start()
        try:
            client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
            client.chat.completions.create(model="fast", messages=SHORT)
            redis_server.__exit__(None, None, None)
            for _ in range(3):
                client.chat.completions.create(model="fast", messages=SHORT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if value(scrape(gw.url), "switchyard_redis_writes_dropped_total") > 0:
                    break
                time.sleep(0.2)
            assert value(scrape(gw.url), "switchyard_redis_writes_dropped_total") > 0
        finally:
            gw.stop()


def test_metrics_with_two_workers_sum_every_worker(make_gateway: Any, msim: SimServer) -> None:
    msim.reset()
    gw = make_gateway(policy(msim), args=["--workers", "2"])
    port = gw.port
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    pids = set()
    for _ in range(40):
        client.chat.completions.create(model="fast", messages=SHORT)
    deadline = time.monotonic() + 10
    while len(pids) < 2 and time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            pids.add(resp.read())
    assert len(pids) == 2, "both workers answer"
    # Each worker adds its tallies to the shared files every quarter second: wait for that
    # (a loaded machine can delay it past any fixed sleep), then every scrape must agree.
    deadline = time.monotonic() + 15
    while value(scrape(f"http://127.0.0.1:{port}"), "switchyard_requests_total", deployment="a") < 40:
        assert time.monotonic() < deadline, "the workers' tallies never reached the shared files"
        time.sleep(0.05)
    # Whichever worker answers the scrape, it reports both workers' requests.
    for _ in range(6):
        m = scrape(f"http://127.0.0.1:{port}")
        assert value(m, "switchyard_requests_total", deployment="a", status="200") == 40
        assert value(m, "switchyard_request_duration_seconds_count", deployment="a") == 40


def test_a_dead_workers_counts_stay_in_the_sum_after_its_restart(make_gateway: Any, msim: SimServer) -> None:
    gw = make_gateway(policy(msim), args=["--workers", "2"])
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for _ in range(20):
        client.chat.completions.create(model="fast", messages=SHORT)
    pids: set[int] = set()
    deadline = time.monotonic() + 10
    while len(pids) < 2 and time.monotonic() < deadline:
        with urllib.request.urlopen(gw.url + "/healthz", timeout=5) as resp:
            pids.add(json.loads(resp.read())["pid"])
    victim = min(pids)
    # A worker adds its tallies to the shared files every quarter second; killed outright, it
    # loses what came after its last sync. A fixed sleep here stood for "both have synced",
    # which a loaded machine can make false (a worker's loop waits for a core past it): the
    # kill then took unsynced requests with it. Kill only once the shared files hold all 20:
    # a scrape syncs the worker that answers it and reads the other's file, so 20 means both.
    deadline = time.monotonic() + 15
    while value(scrape(gw.url), "switchyard_requests_total", deployment="a", status="200") < 20:
        assert time.monotonic() < deadline, "the workers' tallies never reached the shared files"
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    # The parent restarts it; until then and after, every scrape still counts all 20.
    deadline = time.monotonic() + 15
    seen_new = False
    while time.monotonic() < deadline and not seen_new:
        try:
            with urllib.request.urlopen(gw.url + "/healthz", timeout=5) as resp:
                seen_new = json.loads(resp.read())["pid"] not in pids
        except OSError:
            pass
        time.sleep(0.05)
    assert seen_new, "the dead worker was restarted"
    for _ in range(6):
        m = scrape(gw.url)
        assert value(m, "switchyard_requests_total", deployment="a", status="200") == 20
