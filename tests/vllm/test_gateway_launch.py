"""A policy's ``launch:`` starts two real vLLM replicas (CPU build, tiny model) and the
gateway serves through them: readiness, chat and streams with the openai SDK, cached tokens
in /admin/stats, the prefix-hit header against vLLM's own count, /metrics, prefix affinity.

One gateway (and its two vLLM processes) serves the whole module: starting vLLM is the
expensive part on a small machine."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.replicas.vllm_metrics import figures_from_text
from tests.helpers import GatewayProcess, free_ports, http_json, readyz
from tests.vllm.conftest import RealVllm, start_gateway

# vLLM starts in tens of seconds, minutes on a busy 2-core machine.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

WORDS = (
    "gateway replica prefix cache token route policy deployment shaping stream latency budget "
    "tenant request answer model server metric health restart drain block hash window"
).split()


def system_prompt(seed: int, words: int) -> str:
    """Deterministic English-like text, different for each seed from its first word."""
    out = [f"Assistant profile {seed}."]
    for i in range(words):
        out.append(WORDS[(i * 7 + seed * 13 + i // 5) % len(WORDS)])
    return " ".join(out)


@pytest.fixture(scope="module")
def port() -> int:
    return free_ports(2)


@pytest.fixture(scope="module")
def gateway(real_vllm: RealVllm, module_redis: str, workdir: Any, port: int) -> Iterator[GatewayProcess]:
    policy = (
        "deployments:\n"
        "  tiny:\n"
        "    provider: vllm\n"
        "    model: tiny\n"
        "    launch:\n"
        + real_vllm.launch_yaml("      ", replicas=2, port=port)
        + "    replicas: {health_interval_s: 0.2, metrics_interval_s: 0.3}\n"
        "tiers: {fast: [tiny], strong: [tiny]}\n"
    )
    gw = start_gateway(policy, module_redis, workdir, real_vllm)
    try:
        yield gw
    finally:
        gw.stop()


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)


def wait_ready(gw: GatewayProcess, timeout_s: float = 400) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = http_json("GET", gw.url + "/admin/replicas")["deployments"]["tiny"]
        if status["healthy_replicas"] == 2:
            return status
        failed = [
            line for line in gw.log_lines() if line.get("event") in ("vllm_preflight_failed", "vllm_gave_up")
        ]
        assert not failed, failed
        assert time.monotonic() < deadline, gw.log_path.read_text()[-4000:]
        time.sleep(0.5)


def test_not_routed_to_until_ready(gateway: GatewayProcess) -> None:
    # vLLM takes tens of seconds to load; meanwhile requests fail fast and clearly.
    state = readyz(gateway.url)
    assert state["replicas"]["tiny"]["ready"] is False
    started = time.monotonic()
    with client(gateway) as c, pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert time.monotonic() - started < 5
    assert info.value.status_code == 503 and info.value.code == "upstream_unavailable"
    status = wait_ready(gateway)
    assert status["ready"] is True
    preflight = gateway.wait_log(lambda line: line.get("event") == "vllm_preflight_ok")
    assert preflight["platform"] == "cpu" and preflight["block_size"] == 128
    starting = gateway.wait_log(lambda line: line.get("event") == "vllm_starting")
    assert "VLLM_CPU_KVCACHE_SPACE=1" in starting["command"]


def test_chat_and_stream_through_the_gateway_with_the_openai_sdk(gateway: GatewayProcess) -> None:
    wait_ready(gateway)
    with client(gateway) as c:
        reply = c.chat.completions.create(
            model="fast", messages=[{"role": "user", "content": "Say something."}], max_tokens=8
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        stream = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Say more."}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert any(ch.choices and ch.choices[0].finish_reason == "length" for ch in chunks)


def admin_totals(gw: GatewayProcess) -> dict[str, Any]:
    """/admin/stats totals once the earlier requests' counters have all reached Redis."""
    last: dict[str, Any] | None = None
    deadline = time.monotonic() + 15
    while True:
        totals: dict[str, Any] = http_json("GET", gw.url + "/admin/stats?since=1h")["totals"]
        if totals == last or time.monotonic() > deadline:
            return totals
        last = totals
        time.sleep(0.5)


def test_cached_tokens_match_admin_stats_and_the_prefix_hit_header(gateway: GatewayProcess) -> None:
    wait_ready(gateway)
    before = admin_totals(gateway)
    cached: list[int] = []
    expected: list[int] = []
    with client(gateway) as c:
        # Prompts of several lengths (450-1,650 tokens): vLLM counts hits in 128-token blocks,
        # so one prompt alone says little about an estimate's error.
        for seed, words in enumerate((450, 700, 950, 1200, 1450, 1650)):
            system = system_prompt(100 + seed, words)
            for turn in range(2):
                raw = c.chat.completions.with_raw_response.create(
                    model="tiny",
                    messages=[
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {turn}"},
                    ],
                    max_tokens=2,
                )
                usage = raw.parse().usage
                assert usage is not None and usage.prompt_tokens_details is not None
                cached.append(usage.prompt_tokens_details.cached_tokens or 0)
                expected.append(int(raw.headers["x-switchyard-prefix-hit"]))
    hits = [
        (e, c)
        for (e, c), turn in zip(zip(expected, cached, strict=True), [0, 1] * 6, strict=True)
        if turn == 1
    ]
    assert all(c > 0 for _, c in hits), cached  # each repeat hit vLLM's cache
    assert all(c % 128 == 0 for c in cached)  # the CPU backend's blocks
    # The first prompt calibrates the tokens per byte; from then on the header follows vLLM.
    later = hits[1:]
    total_expected, total_cached = sum(e for e, _ in later), sum(c for _, c in later)
    print(
        f"prefix-hit header {total_expected} vs vLLM cached_tokens {total_cached}: {list(zip(expected, cached, strict=True))}"
    )
    assert abs(total_expected - total_cached) <= 0.10 * total_cached, (expected, cached)
    deadline = time.monotonic() + 15
    while True:
        totals = admin_totals(gateway)
        if totals["cached_tokens"] - before["cached_tokens"] >= sum(cached) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert totals["cached_tokens"] - before["cached_tokens"] == sum(cached)
    assert totals["requests"] - before["requests"] == 12


def test_the_shaping_header_counts_the_stable_prefix_with_the_models_tokenizer(
    gateway: GatewayProcess, port: int
) -> None:
    wait_ready(gateway)
    system = system_prompt(77, 500)
    # vLLM's own count of the system prompt's text (no chat-template or special tokens).
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/tokenize",
        data=json.dumps({"model": "tiny", "prompt": system, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        expected = json.loads(answer.read())["count"]
    assert expected != len(system) // 4  # bytes / 4 would not pass for the model's count
    deadline = time.monotonic() + 30  # the count runs in a worker thread after the first request
    with client(gateway) as c:
        while True:
            raw = c.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "system", "content": system}, {"role": "user", "content": "q"}],
                max_tokens=2,
            )
            fields = dict(part.split("=", 1) for part in raw.headers["x-switchyard-shaping"].split("; "))
            if int(fields["stable_prefix_tokens"]) == expected:
                break
            assert time.monotonic() < deadline, (fields, expected)
            time.sleep(0.5)


def scrape(port: int) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return figures_from_text(resp.read().decode(), model_name="tiny")


def test_vllm_metrics_are_parsed_and_shown(gateway: GatewayProcess, port: int) -> None:
    wait_ready(gateway)
    with client(gateway) as c:
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "metrics"}], max_tokens=2
        )
    direct = [scrape(port), scrape(port + 1)]
    for figures in direct:
        assert figures.names["prefix_cache_queries"] == "vllm:prefix_cache_queries_total"
        assert figures.names["prefix_cache_hits"] == "vllm:prefix_cache_hits_total"
        assert figures.running is not None and figures.waiting is not None
        assert figures.kv_cache_usage is not None and figures.block_size == 128
    assert sum(f.ttft_count or 0 for f in direct) >= 1 and any(f.ttft_buckets for f in direct)
    deadline = time.monotonic() + 10
    while True:
        status = http_json("GET", gateway.url + "/admin/replicas")["deployments"]["tiny"]
        shown = [r["metrics"] for r in status["replicas"]]
        if all(m and m["ttft_count"] is not None for m in shown) and sum(m["ttft_count"] for m in shown) >= 1:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert all(m["block_size"] == 128 and m["kv_cache_usage"] is not None for m in shown)
    assert sum(m["prefix_cache_queries_tokens"] for m in shown) > 0
    # The dashboard's "Deployments now" panel shows the same figures.
    live = http_json("GET", gateway.url + "/admin/dashboard")["live"]["tiny"]
    assert live["circuit"] == "closed" and live["healthy_replicas"] == 2
    assert live["prefix_cache_hit_rate"] is not None and live["kv_cache_usage"] is not None
    assert live["running"] is not None and live["waiting"] is not None and live["ttft_mean_ms"] > 0


def routed_home(gw: GatewayProcess) -> int:
    status = http_json("GET", gw.url + "/admin/replicas")["deployments"]["tiny"]
    return sum((r.get("routed_by") or {}).get("home", 0) for r in status["replicas"])


def test_a_shared_prefix_lands_on_the_replica_that_holds_it(gateway: GatewayProcess, port: int) -> None:
    wait_ready(gateway)
    before = [scrape(port), scrape(port + 1)]
    home_before = routed_home(gateway)
    # Eight prefixes over two replicas: all on one replica by chance is < 1 %.
    prompts = [system_prompt(seed, 600) for seed in range(20, 28)]
    repeats = 3
    with client(gateway) as c:
        for turn in range(repeats):
            for system in prompts:
                c.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": f"q{turn}"}],
                    max_tokens=2,
                )
    after = [scrape(port), scrape(port + 1)]
    hits = [
        (a.prefix_cache_hits_tokens or 0) - (b.prefix_cache_hits_tokens or 0)
        for a, b in zip(after, before, strict=True)
    ]
    queries = [
        (a.prefix_cache_queries_tokens or 0) - (b.prefix_cache_queries_tokens or 0)
        for a, b in zip(after, before, strict=True)
    ]
    print(f"affinity: vLLM prefix-cache hits per replica {hits} of queried tokens {queries}")
    # vLLM's own counters: every repeat found its whole prefix (600 words of this text: more
    # than 4 blocks of 128 tokens) on the replica it was sent to, and both replicas hold some.
    assert sum(hits) >= len(prompts) * (repeats - 1) * 4 * 128, (hits, queries)
    assert all(q > 0 for q in queries), queries
    assert routed_home(gateway) - home_before == len(prompts) * repeats


def test_the_probed_placement_is_what_the_tiny_models_template_renders(
    gateway: GatewayProcess, port: int
) -> None:
    import asyncio

    import aiohttp

    from gateway.shaping.chat_template import PROBES
    from gateway.shaping.probe import probe_placement, tokenize_url

    wait_ready(gateway)
    base = f"http://127.0.0.1:{port}/v1"

    async def ask() -> Any:
        async with aiohttp.ClientSession() as session:
            return await probe_placement(session, base, "tiny")

    found = asyncio.run(ask())
    # The tiny model's template renders every message in order, a system message anywhere.
    assert found == "after_last_turn"
    # Every conversation of that placement renders with its late system message in the
    # prompt (vLLM's own /tokenize and chat completions), and the gateway sends such a turn.
    for _, conversations in PROBES[:1]:
        for without, with_late in conversations:
            counts = []
            for messages in (without, with_late):
                request = urllib.request.Request(
                    tokenize_url(base),
                    data=json.dumps({"model": "tiny", "messages": messages}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=60) as answer:
                    counts.append(json.loads(answer.read())["count"])
            assert counts[1] > counts[0]
    deadline = time.monotonic() + 60  # the gateway's probe retries every 10 s while vLLM starts
    minute = 0
    with client(gateway) as c:
        while True:
            raw = c.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[
                    {
                        "role": "system",
                        "content": f"Current time: 12:{minute:02d}:00\n" + system_prompt(9, 200),
                    },
                    {"role": "user", "content": "q0"},
                    {"role": "assistant", "content": "a0"},
                    {"role": "user", "content": f"q{minute + 1}"},
                ],
                max_tokens=2,
            )
            assert raw.parse().choices[0].message is not None  # never refused by the template
            # Once the gateway's own probe answered, the time goes after the newest turn.
            if "turn:" in raw.headers.get("x-switchyard-shaping", ""):
                break
            assert time.monotonic() < deadline, raw.headers
            minute = (minute + 1) % 60
            time.sleep(0.5)


def routed_per_replica(gw: GatewayProcess) -> list[int]:
    status = http_json("GET", gw.url + "/admin/replicas")["deployments"]["tiny"]
    return [sum((r.get("routed_by") or {}).values()) for r in status["replicas"]]


def test_a_dated_system_prompt_keeps_its_home_replica(gateway: GatewayProcess) -> None:
    wait_ready(gateway)
    before = routed_per_replica(gateway)
    rules = system_prompt(41, 600)
    with client(gateway) as c:
        for i in range(6):
            # A new time on every request: shaping moves it, and the replica follows the
            # shaped prefix, not the body's.
            c.chat.completions.create(
                model="tiny",
                messages=[
                    {
                        "role": "system",
                        "content": f"Current time: 2026-12-07T12:{i:02d}:{i * 7 % 60:02d}Z\n{rules}",
                    },
                    {"role": "user", "content": f"question {i}"},
                ],
                max_tokens=2,
            )
    grew = [a - b for a, b in zip(routed_per_replica(gateway), before, strict=True)]
    assert sorted(grew) == [0, 6], grew  # every repeat on one replica, its home


def test_the_tiny_models_template_read_offline_gives_the_same_placement(real_vllm: RealVllm) -> None:
    from gateway.shaping.chat_template import render_placement

    # What the gateway reads from the model directory before vLLM is up is what the
    # deployment's /tokenize accepts (test_the_probed_placement_is_what_...: after_last_turn).
    assert render_placement(real_vllm.model) == "after_last_turn"
