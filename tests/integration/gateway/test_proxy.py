"""The OpenAI contract through the gateway: the official SDK, sync and async, stream and not."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    extra = """
aliases:
  small: sim-fast
"""
    gw = GatewayProcess(
        sim_policy(sim.base_url, extra), redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw")
    )
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess, sim: SimServer) -> openai.OpenAI:
    sim.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def test_chat_non_stream(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert raw.headers["x-switchyard-model"] == "sim-fast"
    assert raw.headers["x-switchyard-route"] == "tier=fast; by=model"
    assert raw.headers["x-switchyard-attempts"] == "1"
    assert raw.headers["x-request-id"].startswith("req_")


def test_request_id_from_the_client_is_kept(client: openai.OpenAI, sim: SimServer) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="sim-strong", messages=MESSAGES, extra_headers={"x-request-id": "abc-123"}
    )
    assert raw.headers["x-request-id"] == "abc-123"
    assert raw.headers["x-switchyard-route"] == "deployment=sim-strong; by=model"
    assert sim.stats()["recent"][-1]["x-request-id"] == "abc-123"


def test_tier_alias_and_auto_resolve(client: openai.OpenAI) -> None:
    assert (
        client.chat.completions.with_raw_response.create(model="small", messages=MESSAGES).headers[
            "x-switchyard-model"
        ]
        == "sim-fast"
    )
    auto = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    assert auto.headers["x-switchyard-model"] == "sim-fast"
    assert auto.headers["x-switchyard-route"] == "tier=fast; by=default"
    strong = client.chat.completions.with_raw_response.create(model="strong", messages=MESSAGES)
    assert strong.headers["x-switchyard-model"] == "sim-strong"


def test_chat_stream_without_usage_requested_hides_the_usage_chunk(
    client: openai.OpenAI, sim: SimServer
) -> None:
    chunks = list(client.chat.completions.create(model="fast", messages=MESSAGES, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(c.choices for c in chunks), "the usage-only chunk the gateway asked for must be stripped"
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The gateway asked the upstream for usage on the client's behalf.
    assert "stream_options" in sim.stats()["recent"][-1]["body_keys"]


def test_chat_stream_with_usage_requested(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="fast", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_stream_text_equals_non_stream_text(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=12)
    streamed = client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=12, stream=True)
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == whole.choices[0].message.content
    )


def test_unknown_fields_pass_through(client: openai.OpenAI, sim: SimServer) -> None:
    client.chat.completions.create(
        model="fast", messages=MESSAGES, extra_body={"vendor_knob": {"a": 1}, "top_k": 5}
    )
    keys = sim.stats()["recent"][-1]["body_keys"]
    assert "vendor_knob" in keys and "top_k" in keys


def test_completions_and_embeddings(client: openai.OpenAI) -> None:
    text = client.completions.create(model="fast", prompt="Once upon a time", max_tokens=5)
    assert text.object == "text_completion" and text.choices[0].text
    streamed = list(
        client.completions.create(model="fast", prompt="Once upon a time", max_tokens=5, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text.choices[0].text
    emb = client.embeddings.create(model="fast", input=["a", "b"])
    assert len(emb.data) == 2
    assert abs(sum(x * x for x in emb.data[0].embedding) - 1.0) < 1e-3


def test_models_list_names_every_model(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert ids == {"sim-fast", "sim-strong", "fast", "strong", "small", "auto"}
    assert client.models.retrieve("fast").id == "fast"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_async_client_stream_and_non_stream(gateway: GatewayProcess) -> None:
    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key="x", max_retries=0) as client:
            whole, stream = await asyncio.gather(
                client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=8),
                client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=8, stream=True),
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(run())
    assert whole and whole == streamed


def test_stream_is_forwarded_as_it_is_generated(make_gateway: Any) -> None:
    """With 100 ms between tokens, chunks reach the client spread out in time, not all at the end."""

    async def arrivals(url: str) -> list[float]:
        times = []
        body = {"model": "slow", "messages": MESSAGES, "stream": True, "max_tokens": 6}
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
            assert resp.status == 200
            async for _ in resp.content.iter_any():
                times.append(time.perf_counter())
        return times

    with SimServer("--model", "slow:10:100") as slow:
        gw = make_gateway(f"""
deployments:
  slow: {{base_url: "{slow.base_url}"}}
tiers: {{fast: [slow]}}
""")
        times = asyncio.run(arrivals(gw.base_url + "/chat/completions"))
    assert len(times) >= 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(1 for g in gaps if g > 0.05) >= 4, gaps
