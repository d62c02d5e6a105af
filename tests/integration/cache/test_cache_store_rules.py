"""What the response cache keeps, beyond the plain repeat: a stream says ``store`` before its
end and is kept only if it ends whole; an answer another deployment made (a retry on the
next one, a fallback tier) is kept under that deployment's model, never under the one the
route tried first; a Responses request that continues a stored conversation
(``previous_response_id``) is never cached."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
import redis

from tests.helpers import GatewayProcess, SimServer
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

KEYED = {"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}


@pytest.fixture(scope="module")
def sim3() -> Iterator[SimServer]:
    """Three upstream models, so that a fault on one leaves the others answering."""
    with SimServer("--model", "m-a:5:1", "--model", "m-b:5:1", "--model", "m-c:5:1") as server:
        yield server


def policy(base_url: str) -> str:
    return f"""
deployments:
  sim-a: {{provider: vllm, base_url: "{base_url}", model: m-a}}
  sim-b: {{provider: vllm, base_url: "{base_url}", model: m-b}}
  sim-c: {{provider: vllm, base_url: "{base_url}", model: m-c}}
  lone: {{provider: vllm, base_url: "{base_url}", model: m-a}}
tiers:
  fast: [sim-a, sim-b]
  backup: [sim-c]
dispatch:
  fallback: {{fast: [backup]}}
  retries: {{backoff: {{base_s: 0.01, max_s: 0.02}}}}
cache:
  enabled: true
  tiers:
    backup: {{ttl_s: 2m}}
"""


@pytest.fixture(scope="module")
def gateway(
    sim3: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("cache-rules")
    gw = GatewayProcess(policy(sim3.base_url), redis_url=redis_url, workdir=workdir, env=KEYED)
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def key(gateway: GatewayProcess) -> str:
    status, body = admin(gateway, "POST", "/admin/keys", {"name": "rules"})
    assert status in (200, 201), body
    return str(body["key"])


def entries(redis_url: str) -> set[bytes]:
    return set(redis.Redis.from_url(redis_url).scan_iter(match="sy:rc:*"))


def wait_stored(redis_url: str, before: set[bytes]) -> bytes:
    """Stores are written off the client's path: the one new entry, once it is there."""
    deadline = time.monotonic() + 5
    while not entries(redis_url) - before:
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.02)
    (new,) = entries(redis_url) - before
    return new


def calls(sim: SimServer) -> int:
    return int(sim.stats()["requests_total"])


def question() -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {uuid.uuid4().hex}"}]


def chat(gw: GatewayProcess, key: str, model: str, messages: list[dict[str, Any]]) -> tuple[str, str, bytes]:
    """``(x-switchyard-cache, x-switchyard-model, the body)`` of a non-stream chat."""
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=15)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, temperature=0)  # type: ignore[arg-type]
    return (
        raw.headers.get("x-switchyard-cache", ""),
        raw.headers["x-switchyard-model"],
        raw.http_response.content,
    )


def test_a_chat_stream_says_store_and_is_kept_for_the_next_request(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=15)
    messages = question()
    before = entries(redis_url)
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=messages,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    assert raw.headers["x-switchyard-cache"] == "store"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    wait_stored(redis_url, before)
    upstream = calls(sim3)
    header, _, body = chat(gateway, key, "fast", messages)
    assert header == "hit" and upstream == calls(sim3)
    assert openai.types.chat.ChatCompletion.model_validate_json(body).choices[0].message.content == text


def test_an_anthropic_stream_says_store_and_is_kept(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=15)
    messages = [{"role": "user", "content": f"anthropic {uuid.uuid4().hex}"}]
    extra: dict[str, Any] = {"temperature": 0}
    before = entries(redis_url)
    with client.messages.stream(model="fast", max_tokens=100, messages=messages, extra_body=extra) as stream:  # type: ignore[arg-type]
        assert stream.response.headers["x-switchyard-cache"] == "store"
        text = "".join(stream.text_stream)
    wait_stored(redis_url, before)
    upstream = calls(sim3)
    again = client.messages.with_raw_response.create(
        model="fast",
        max_tokens=100,
        messages=messages,
        extra_body=extra,  # type: ignore[arg-type]
    )
    assert again.headers["x-switchyard-cache"] == "hit"
    assert again.parse().content[0].text == text  # type: ignore[union-attr]
    assert calls(sim3) == upstream


def test_a_stream_cut_short_said_store_but_is_not_kept_and_counts_as_a_miss(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=15)
    before = entries(redis_url)
    sim3.set_fault("m-a", "reset_mid_stream=1", count=1)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="lone",
            messages=question(),
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        assert raw.headers["x-switchyard-cache"] == "store"
        with pytest.raises(openai.APIError):
            list(raw.parse())
    finally:
        sim3.clear_faults()
    # The stats count what happened: a miss, not a store.
    deadline = time.monotonic() + 5
    while True:
        _, stats = admin(gateway, "GET", "/admin/stats?since=10m")
        row = stats["deployments"].get("lone", {})
        if row.get("rc_misses"):
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert row.get("rc_stores", 0) == 0
    assert entries(redis_url) == before


def test_an_answer_of_the_next_deployment_is_kept_under_its_own_model(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    messages = question()
    before = entries(redis_url)
    sim3.set_fault("m-a", "error=500", count=1)
    try:
        header, model, answer = chat(gateway, key, "fast", messages)
    finally:
        sim3.clear_faults()
    assert (header, model) == ("store", "sim-b")
    wait_stored(redis_url, before)
    upstream = calls(sim3)
    # Whoever asks sim-b's model gets sim-b's answer ...
    assert chat(gateway, key, "sim-b", messages) == ("hit", "sim-b", answer)
    assert calls(sim3) == upstream
    # ... but the tier, its first deployment healthy again, asks sim-a: its answer is its own.
    header, model, _ = chat(gateway, key, "fast", messages)
    assert (header, model) == ("store", "sim-a") and calls(sim3) == upstream + 1


def test_a_fallback_tier_answer_is_kept_with_that_tier_s_ttl(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    messages = question()
    before = entries(redis_url)
    sim3.set_fault("m-a", "error=500", count=1)
    sim3.set_fault("m-b", "error=500", count=1)
    try:
        header, model, answer = chat(gateway, key, "fast", messages)
    finally:
        sim3.clear_faults()
    assert (header, model) == ("store", "sim-c")
    new = wait_stored(redis_url, before)
    # The backup tier's TTL (2 min), not the policy's hour: the entry is that tier's.
    assert 0 < redis.Redis.from_url(redis_url).pttl(new) <= 120_000
    assert chat(gateway, key, "backup", messages) == ("hit", "sim-c", answer)


def test_a_continued_responses_conversation_is_never_cached(
    gateway: GatewayProcess, key: str, sim3: SimServer, redis_url: str
) -> None:
    """``previous_response_id`` brings server-side state the key cannot see (the stored
    conversation): the same request body can mean another conversation."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=15)
    first = client.responses.create(model="fast", input=f"remember {uuid.uuid4().hex}", temperature=0)
    before = entries(redis_url)
    for _ in range(2):
        upstream = calls(sim3)
        raw = client.responses.with_raw_response.create(
            model="fast",
            input="what did I ask you to remember?",
            previous_response_id=first.id,
            temperature=0,
        )
        assert raw.headers["x-switchyard-cache"] == "bypass"
        assert raw.parse().status == "completed"
        assert calls(sim3) == upstream + 1
    time.sleep(0.3)
    assert entries(redis_url) == before
