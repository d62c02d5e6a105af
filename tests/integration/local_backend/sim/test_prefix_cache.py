"""The simulated prefix cache as a client sees it: ``cached_tokens``, TTFT and ``/metrics``."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

from gateway.prompt_render import render_chat
from local_backend.sim import ModelProfile, SimConfig, SimControl, SimThread, token_count

LONG = "The lighthouse keeper logs wind, tide and every ship that passes the point. " * 12  # ~900 bytes


def chat(user: str, system: str = LONG) -> list[Any]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def cached(reply: Any) -> int:
    return int(reply.usage.prompt_tokens_details.cached_tokens)


def test_repeat_hits_every_block_but_the_last_token(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="m", messages=chat("q"))
    again = client.chat.completions.create(model="m", messages=chat("q"))
    assert cached(first) == 0
    prompt_tokens = again.usage.prompt_tokens  # type: ignore[union-attr]
    assert cached(again) == (prompt_tokens - 1) // 16 * 16
    assert cached(again) % 16 == 0 and 0 < cached(again) < prompt_tokens
    stream = client.chat.completions.create(
        model="m", messages=chat("q"), stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert usage[0].prompt_tokens_details.cached_tokens == cached(again)  # type: ignore[union-attr]


def test_a_change_keeps_the_blocks_before_it(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=chat("first question"))
    other = client.chat.completions.create(model="m", messages=chat("second question"))
    a = render_chat({"messages": chat("first question")})
    b = render_chat({"messages": chat("second question")})
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert cached(other) == common // 64 * 16 > 200


def test_a_change_at_the_start_drops_the_whole_prefix(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=chat("q"))
    moved = client.chat.completions.create(model="m", messages=chat("q", "Today is Monday. " + LONG))
    assert cached(moved) == 0


def test_each_model_and_each_cache_salt_has_its_own_cache(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=chat("q"))
    assert cached(client.chat.completions.create(model="timed", messages=chat("q"), max_tokens=1)) == 0
    salted = client.chat.completions.create(
        model="m", messages=chat("q"), extra_body={"cache_salt": "tenant-b"}
    )
    assert cached(salted) == 0


def test_lru_with_a_tiny_capacity_evicts_the_oldest_tail() -> None:
    config = SimConfig(models={"c": ModelProfile(ttft_ms=0, itl_ms=0)}, cache_capacity_blocks=20)
    with SimThread(config) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)

        def ask(prompt: str) -> int:
            usage = client.completions.create(model="c", prompt=prompt, max_tokens=1).usage
            return int(usage.prompt_tokens_details.cached_tokens)  # type: ignore[union-attr]

        a, b = "a" * 960, "b" * 960  # 240 tokens = 15 blocks each
        assert ask(a) == 0
        assert ask(a) == 224  # 14 blocks: the last one holds the last token
        assert ask(b) == 0  # 30 blocks > 20: a's 10 tail blocks go
        assert ask(a) == 5 * 16  # a's head survives
        assert ask(b) == 5 * 16  # re-inserting a evicted b's tail, not its head


def test_openai_mode_counts_only_long_prompts_in_128_token_steps() -> None:
    config = SimConfig(models={"o": ModelProfile(ttft_ms=0, itl_ms=0)}, cache_model="openai", cache_ttl_s=0.4)
    with SimThread(config) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
        short = chat("q", "x" * 3000)  # about 760 tokens
        client.chat.completions.create(model="o", messages=short, max_tokens=1)
        assert cached(client.chat.completions.create(model="o", messages=short, max_tokens=1)) == 0
        long = chat("q", "y" * 8000)  # about 2,010 tokens
        client.chat.completions.create(model="o", messages=long, max_tokens=1)
        hit = client.chat.completions.create(model="o", messages=long, max_tokens=1)
        prompt_tokens = hit.usage.prompt_tokens  # type: ignore[union-attr]
        assert cached(hit) == ((prompt_tokens - 1) // 16 * 16) // 128 * 128
        assert cached(hit) >= 1024 and cached(hit) % 128 == 0
        time.sleep(0.6)  # past the idle TTL: the entries are gone
        assert cached(client.chat.completions.create(model="o", messages=long, max_tokens=1)) == 0


def test_none_mode_never_caches() -> None:
    with SimThread(SimConfig(cache_model="none")) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
        for _ in range(2):
            reply = client.chat.completions.create(model="sim-fast", messages=chat("q"), max_tokens=1)
        assert cached(reply) == 0


def test_cached_prefix_shortens_the_first_token(client: openai.OpenAI) -> None:
    system = "Background facts about lighthouses and their keepers. " * 220  # ~3,000 tokens
    prompt_tokens = token_count(render_chat({"messages": chat("q", system)}))

    def ttft_s() -> float:
        t0 = time.perf_counter()
        stream = client.chat.completions.create(model="prefill", messages=chat("q", system), stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                elapsed = time.perf_counter() - t0
                stream.close()
                return elapsed
        raise AssertionError("no content")

    cold, warm = ttft_s(), ttft_s()
    assert cold >= 0.150 * prompt_tokens / 1000  # 150 ms per 1,000 uncached tokens
    assert warm < 0.1 < cold / 4


def scrape(sim: SimThread) -> dict[str, Any]:
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return {f.name: f for f in text_string_to_metric_families(resp.read().decode())}


def sample(families: dict[str, Any], family: str, name: str, model: str) -> float:
    values = [s.value for s in families[family].samples if s.name == name and s.labels["model_name"] == model]
    assert len(values) == 1, (family, name, model)
    return float(values[0])


def test_metrics_use_vllm_names_and_count_tokens(
    client: openai.OpenAI, sim: SimThread, control: SimControl
) -> None:
    replies = [client.chat.completions.create(model="m", messages=chat("metrics")) for _ in range(2)]
    families = scrape(sim)
    stats = control.stats()
    queries = sample(families, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total", "m")
    hits = sample(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total", "m")
    assert queries == stats["prefix_cache"]["queries_tokens"] == sum(r.usage.prompt_tokens for r in replies)  # type: ignore[union-attr]
    assert hits == stats["prefix_cache"]["hits_tokens"] == cached(replies[1]) > 0
    assert sample(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total", "m") == queries
    generated = sum(r.usage.completion_tokens for r in replies)  # type: ignore[union-attr]
    assert sample(families, "vllm:generation_tokens", "vllm:generation_tokens_total", "m") == generated
    ttft = "vllm:time_to_first_token_seconds"
    assert sample(families, ttft, ttft + "_count", "m") == 2
    assert sample(families, ttft, ttft + "_count", "timed") == 0
    itl = "vllm:inter_token_latency_seconds"
    assert sample(families, itl, itl + "_count", "m") == generated - 2
    e2e = "vllm:e2e_request_latency_seconds"
    assert sample(families, e2e, e2e + "_count", "m") == 2
    assert sample(families, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc", "m") > 0
    assert sample(families, "vllm:num_requests_running", "vllm:num_requests_running", "m") == 0
    assert sample(families, "vllm:num_requests_waiting", "vllm:num_requests_waiting", "m") == 0


def test_running_and_waiting_gauges_and_the_queue() -> None:
    config = SimConfig(models={"q": ModelProfile(ttft_ms=150, itl_ms=0)}, max_num_seqs=1)
    with SimThread(config) as sim:
        seen: list[tuple[float, float]] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                families = scrape(sim)
                running = sample(families, "vllm:num_requests_running", "vllm:num_requests_running", "q")
                waiting = sample(families, "vllm:num_requests_waiting", "vllm:num_requests_waiting", "q")
                seen.append((running, waiting))
                time.sleep(0.02)

        async def three() -> float:
            async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client:
                t0 = time.perf_counter()
                await asyncio.gather(
                    *(
                        client.chat.completions.create(model="q", messages=chat("x"), max_tokens=1)
                        for _ in range(3)
                    )
                )
                return time.perf_counter() - t0

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            elapsed = asyncio.run(three())
        finally:
            done.set()
            watcher.join()
        families = scrape(sim)
    assert elapsed >= 0.45  # one at a time: 3 x 150 ms
    assert (1.0, 2.0) in seen and max(r for r, _ in seen) == 1.0
    queue = "vllm:request_queue_time_seconds"
    assert sample(families, queue, queue + "_count", "q") == 3
    assert sample(families, queue, queue + "_sum", "q") >= 0.4  # 0 + 150 + 300 ms of waiting
