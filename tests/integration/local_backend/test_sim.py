"""The simulator on the wire, as the official SDK and a Prometheus scraper see it."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import SimServer

LONG_SYSTEM = "You are a meticulous assistant. " * 40  # about 1,280 bytes


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("--model", "m:5:1", "--model", "slow:30:20", "--prefill-ms-per-1k", "200") as s:
        yield s


@pytest.fixture()
def client(server: SimServer) -> openai.OpenAI:
    server.reset()
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=10)


def chat(user: str, system: str = LONG_SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_non_stream_shape_and_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=chat("hi"), max_tokens=5)
    assert reply.id.startswith("chatcmpl-") and reply.model == "m"
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_output_is_deterministic(client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model="m", messages=chat("same"))
    b = client.chat.completions.create(model="m", messages=chat("same"))
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stream_usage_only_when_asked(client: openai.OpenAI) -> None:
    plain = list(client.chat.completions.create(model="m", messages=chat("hi"), stream=True))
    assert plain[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in plain)
    assert plain[-1].choices[0].finish_reason is not None
    with_usage = list(
        client.chat.completions.create(model="m", messages=chat("hi"), stream=True, stream_options={"include_usage": True})
    )
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in with_usage if c.choices)
    assert with_usage[-1].usage.completion_tokens == len(text.split())


def test_prefix_cache_hits_in_blocks_and_follows_the_prefix(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="m", messages=chat("question one"))
    again = client.chat.completions.create(model="m", messages=chat("question one"))
    assert first.usage and again.usage and again.usage.prompt_tokens_details
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 0 and cached % 16 == 0 and cached < again.usage.prompt_tokens
    # Same system prompt, other question: the shared prefix stays cached.
    other = client.chat.completions.create(model="m", messages=chat("a different question"))
    assert other.usage and other.usage.prompt_tokens_details
    assert (other.usage.prompt_tokens_details.cached_tokens or 0) >= 300
    # A change at the very start breaks the whole chain.
    moved = client.chat.completions.create(model="m", messages=chat("question one", "Today is Monday. " + LONG_SYSTEM))
    assert moved.usage and moved.usage.prompt_tokens_details
    assert moved.usage.prompt_tokens_details.cached_tokens == 0


def test_cached_prefix_shortens_the_first_token(client: openai.OpenAI) -> None:
    system = "Background facts about lighthouses. " * 300  # ~10,800 bytes: 2.7k tokens, ~540 ms prefill
    def ttft() -> float:
        t0 = time.perf_counter()
        stream = client.chat.completions.create(model="slow", messages=chat("q", system), stream=True, max_tokens=2)
        next(iter(stream))
        elapsed = time.perf_counter() - t0
        list(stream)
        return elapsed
    cold, warm = ttft(), ttft()
    assert cold > 0.4
    assert warm < cold / 3


def test_faults_as_a_client_sees_them(client: openai.OpenAI, server: SimServer) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "rate_limit=4"})
    assert info.value.response.headers["retry-after"] == "4"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "error=503"})
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "context_length"})
    assert bad.value.code == "context_length_exceeded"
    reply = client.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "empty"})
    assert reply.choices[0].message.content == ""
    reply = client.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "length"})
    assert reply.choices[0].finish_reason == "length"
    stats = server.stats()
    assert stats["faults"] == {"rate_limit": 1, "error": 1, "context_length": 1, "empty": 1, "length": 1}


def raw_stream(server: SimServer, fault: str, timeout: float = 5) -> bytes:
    req = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=b'{"model": "m", "stream": true, "max_tokens": 30, "messages": [{"role": "user", "content": "x"}]}',
        headers={"Content-Type": "application/json", "x-sim-fault": fault},
    )
    out = b""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            while chunk := resp.read1(65536):
                out += chunk
    except Exception:
        pass
    return out


def test_reset_mid_stream_cuts_without_done(server: SimServer) -> None:
    server.reset()
    out = raw_stream(server, "reset_mid_stream=3")
    assert out.count(b"data: ") == 4  # the role chunk and three content chunks
    assert b"[DONE]" not in out


def test_malformed_chunk_and_stall(server: SimServer) -> None:
    out = raw_stream(server, "malformed_chunk=2")
    assert b"data: {not json\n\n" in out and out.endswith(b"data: [DONE]\n\n")
    t0 = time.perf_counter()
    out = raw_stream(server, "stall_mid_stream=2:300")
    assert time.perf_counter() - t0 > 0.3 and out.endswith(b"data: [DONE]\n\n")
    out = raw_stream(server, "stall_mid_stream=2", timeout=0.5)
    assert b"[DONE]" not in out and out.count(b"data: ") == 3


def test_hang_until_the_client_leaves_is_counted_cancelled(client: openai.OpenAI, server: SimServer) -> None:
    quick = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        quick.chat.completions.create(model="m", messages=chat("x"), extra_headers={"x-sim-fault": "hang"})
    deadline = time.monotonic() + 3
    while server.stats()["cancelled"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = server.stats()
    assert stats["cancelled"] == 1 and stats["in_flight"] == 0
    assert stats["recent"][-1]["outcome"] == "cancelled"


def test_per_model_fault_rules(client: openai.OpenAI, server: SimServer) -> None:
    server.set_fault("m", "error=500", count=2)
    results = []
    for _ in range(3):
        try:
            client.chat.completions.create(model="m", messages=chat("x"))
            results.append("ok")
        except openai.InternalServerError:
            results.append("500")
    assert results == ["500", "500", "ok"]
    server.set_fault("*", "slow_first_token=200")
    t0 = time.perf_counter()
    client.chat.completions.create(model="m", messages=chat("x"), max_tokens=1)
    assert time.perf_counter() - t0 > 0.2
    server.clear_faults()


def test_unknown_model_and_bad_json(client: openai.OpenAI, server: SimServer) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=chat("x"))
    req = urllib.request.Request(server.base_url + "/chat/completions", data=b"{", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 400


def test_tool_calls_and_json_mode(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    reply = client.chat.completions.create(model="m", messages=chat("x"), tools=tools, tool_choice="required")  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.tool_calls and reply.choices[0].message.tool_calls[0].function.name == "lookup"  # type: ignore[union-attr]
    reply = client.chat.completions.create(model="m", messages=chat("x"), response_format={"type": "json_object"})
    import json

    assert "answer" in json.loads(reply.choices[0].message.content or "")
    bad = client.chat.completions.create(
        model="m", messages=chat("x"), response_format={"type": "json_object"}, extra_headers={"x-sim-fault": "bad_json"}
    )
    with pytest.raises(ValueError):
        json.loads(bad.choices[0].message.content or "")


def test_completions_and_embeddings(client: openai.OpenAI) -> None:
    text = client.completions.create(model="m", prompt="Once", max_tokens=4)
    streamed = list(client.completions.create(model="m", prompt="Once", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text.choices[0].text
    b64 = client.embeddings.create(model="m", input=["alpha", "beta"])  # the SDK asks for base64
    floats = client.embeddings.create(model="m", input=["alpha", "beta"], encoding_format="float")
    assert b64.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert len(floats.data[1].embedding) == 64
    assert sum(x * x for x in floats.data[1].embedding) == pytest.approx(1.0, abs=1e-5)
    dims = client.embeddings.create(model="m", input="alpha", dimensions=8, encoding_format="float")
    assert len(dims.data[0].embedding) == 8
    assert floats.usage.prompt_tokens > 0
    raw = base64.b64decode(
        openai.OpenAI(base_url=client.base_url, api_key="x").embeddings.with_raw_response.create(
            model="m", input="alpha", encoding_format="base64"
        ).http_response.json()["data"][0]["embedding"]
    )
    assert len(struct.unpack(f"<{len(raw) // 4}f", raw)) == 64


def test_models_health_and_metrics(client: openai.OpenAI, server: SimServer) -> None:
    assert {m.id for m in client.models.list()} == {"m", "slow"}
    with urllib.request.urlopen(server.url + "/health") as resp:
        assert resp.status == 200
    client.chat.completions.create(model="m", messages=chat("metrics"))
    client.chat.completions.create(model="m", messages=chat("metrics"))
    with urllib.request.urlopen(server.url + "/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    queries = {s.labels["model_name"]: s.value for s in families["vllm:prefix_cache_queries"].samples}
    hits = {s.labels["model_name"]: s.value for s in families["vllm:prefix_cache_hits"].samples}
    stats = server.stats()
    assert queries["m"] == stats["prefix_cache"]["queries_tokens"] > 0
    assert hits["m"] == stats["prefix_cache"]["hits_tokens"] > 0
    ttft = [s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert any(s.value == 2 for s in ttft if s.labels["model_name"] == "m")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in families


def test_max_num_seqs_queues_requests() -> None:
    with SimServer("--model", "q:100:0", "--max-num-seqs", "1") as s:
        async def run() -> float:
            async with openai.AsyncOpenAI(base_url=s.base_url, api_key="x", max_retries=0) as c:
                t0 = time.perf_counter()
                await asyncio.gather(*(c.chat.completions.create(model="q", messages=chat("x"), max_tokens=1) for _ in range(3)))
                return time.perf_counter() - t0
        assert asyncio.run(run()) > 0.3  # three requests one after another


def test_api_key_required() -> None:
    with SimServer("--require-api-key", "sk-sim") as s:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base_url, api_key="wrong", max_retries=0).models.list() and openai.OpenAI(
                base_url=s.base_url, api_key="wrong", max_retries=0
            ).chat.completions.create(model="sim-fast", messages=chat("x"))
        ok = openai.OpenAI(base_url=s.base_url, api_key="sk-sim", max_retries=0)
        assert ok.chat.completions.create(model="sim-fast", messages=chat("x")).choices
        assert s.stats()["recent"][-1]["authorization"] is True
