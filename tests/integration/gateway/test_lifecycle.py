"""Client disconnects, hot reload, and the request log line."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import SimServer, sim_policy

MESSAGES = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_client_disconnect_mid_stream_cancels_the_upstream(make_gateway: Any) -> None:
    with SimServer("--model", "slow:10:50") as slow:
        gw = make_gateway(f'deployments:\n  slow: {{base_url: "{slow.base_url}"}}\ntiers: {{fast: [slow]}}\n')

        async def read_a_little() -> None:
            body = {"model": "slow", "messages": MESSAGES, "stream": True, "max_tokens": 200}
            async with aiohttp.ClientSession() as session:
                resp = await session.post(gw.base_url + "/chat/completions", json=body)
                await resp.content.readany()
                resp.close()

        asyncio.run(read_a_little())
        wait_for(lambda: slow.stats()["cancelled"] == 1)
        assert slow.stats()["in_flight"] == 0
        gw.wait_log(lambda line: line.get("event") == "request" and line.get("status") == 499)


def test_client_disconnect_while_waiting_cancels_the_upstream(make_gateway: Any) -> None:
    with SimServer("--model", "slow:10:50") as slow:
        gw = make_gateway(f'deployments:\n  slow: {{base_url: "{slow.base_url}"}}\ntiers: {{fast: [slow]}}\n')
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=0.5)
        slow.set_fault("slow", "hang", count=1)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="slow", messages=MESSAGES)  # type: ignore[arg-type]
        wait_for(lambda: slow.stats()["cancelled"] == 1)


def test_policy_edit_takes_effect_and_a_bad_edit_keeps_the_old_policy(
    sim: SimServer, make_gateway: Any
) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="quick", messages=MESSAGES)  # type: ignore[arg-type]

    gw.write_policy(sim_policy(sim.base_url, "aliases: {quick: sim-strong}"))
    t0 = time.monotonic()
    while True:
        try:
            raw = client.chat.completions.with_raw_response.create(model="quick", messages=MESSAGES)  # type: ignore[arg-type]
            break
        except openai.NotFoundError:
            assert time.monotonic() - t0 < 2.0, "reload took longer than 2 s"
            time.sleep(0.05)
    assert raw.headers["x-switchyard-model"] == "sim-strong"

    gw.write_policy(sim_policy(sim.base_url, "aliases: {quick: sim-nothing}"))
    wait_for(lambda: readyz(gw.url)["policy"]["reload_error"] is not None)
    ready = readyz(gw.url)
    assert ready["policy"]["reload_error"] == [
        "aliases.quick: unknown deployment or tier 'sim-nothing'"
    ] or any("aliases.quick" in e for e in ready["policy"]["reload_error"])
    # The previous policy still answers.
    again = client.chat.completions.with_raw_response.create(model="quick", messages=MESSAGES)  # type: ignore[arg-type]
    assert again.headers["x-switchyard-model"] == "sim-strong"


def test_reload_does_not_drop_a_stream_in_flight(make_gateway: Any) -> None:
    with SimServer("--model", "slow:10:40") as slow:
        policy = f'deployments:\n  slow: {{base_url: "{slow.base_url}"}}\ntiers: {{fast: [slow]}}\n'
        gw = make_gateway(policy)
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        stream = client.chat.completions.create(model="slow", messages=MESSAGES, stream=True, max_tokens=40)  # type: ignore[arg-type]
        first = next(iter(stream))
        # Change the deployment itself, so its client is replaced while the stream runs.
        gw.write_policy(policy.replace("{base_url:", "{max_connections: 7, base_url:"))
        wait_for(lambda: readyz(gw.url)["policy"]["version"] == 2)
        rest = list(stream)
        assert first.choices
        assert rest[-1].choices[0].finish_reason in ("stop", "length")
        assert len(rest) >= 16


def readyz(url: str) -> Any:
    with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
        return json.loads(resp.read())


def test_one_log_line_per_request_without_prompt_text(sim: SimServer, make_gateway: Any) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-client-secret", max_retries=0)
    secret_prompt = "my-very-private-prompt-text"
    client.chat.completions.create(model="fast", messages=[{"role": "user", "content": secret_prompt}])
    list(client.chat.completions.create(model="strong", messages=MESSAGES, stream=True))
    line = gw.wait_log(lambda entry: entry.get("event") == "request" and entry.get("stream") is True)
    for key in (
        "request_id",
        "key_id",
        "model",
        "deployment",
        "status",
        "attempts",
        "ttft_ms",
        "total_ms",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
    ):
        assert key in line, key
    assert line["deployment"] == "sim-strong" and line["status"] == 200 and line["attempts"] == 1
    assert line["ttft_ms"] > 0 and line["total_ms"] >= line["ttft_ms"]
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0
    requests = [entry for entry in gw.log_lines() if entry.get("event") == "request"]
    assert len(requests) == 2
    text = gw.log_path.read_text()
    assert secret_prompt not in text and "sk-client-secret" not in text
