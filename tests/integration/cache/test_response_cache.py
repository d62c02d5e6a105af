"""The response cache through the official SDKs: a repeated deterministic request is
answered from Redis (no upstream call), in the form it asked for, only to its tenant; the
answers that must never be kept are not."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import redis

from gateway.cachestats.cli import render
from tests.helpers import ROOT, GatewayProcess, SimServer
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

KEYED = {"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def cache_policy(sim_base_url: str) -> str:
    return f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim_base_url}", price: {{input: 1.0, output: 2.0}}}}
  sim-strong: {{provider: openai, base_url: "{sim_base_url}", price: {{input: 3.0, output: 6.0}}}}
tiers:
  fast: [sim-fast]
  strong: [sim-strong]
cache:
  enabled: true
  keys:
    team-a1: {{namespace: team-a}}
    team-a2: {{namespace: team-a}}
    denied: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("cache")
    gw = GatewayProcess(cache_policy(sim.base_url), redis_url=redis_url, workdir=workdir, env=KEYED)
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def keys(gateway: GatewayProcess) -> dict[str, str]:
    made = {}
    for name in ("team-a1", "team-a2", "team-b", "denied"):
        status, body = admin(gateway, "POST", "/admin/keys", {"name": name})
        assert status in (200, 201), body
        made[name] = body["key"]
        made[name + ":id"] = body["id"]
    return made


def oai(gw: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=15)


def ask(text: str | None = None) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text or f"question {uuid.uuid4().hex}"}]


def upstream_calls(sim: SimServer) -> int:
    return int(sim.stats()["requests_total"])


def entries(redis_url: str) -> list[bytes]:
    return sorted(redis.Redis.from_url(redis_url).scan_iter(match="sy:rc:*"))


def wait_stored(redis_url: str, before: int) -> None:
    """Stores are written off the client's path: wait until one more entry is there."""
    deadline = time.monotonic() + 5
    while len(entries(redis_url)) <= before:
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.02)


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> tuple[str, bytes]:
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=messages, temperature=0, **kw
    )  # type: ignore[call-overload]
    return raw.headers.get("x-switchyard-cache", ""), raw.http_response.content


def stream_chat(
    client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any
) -> tuple[str, dict[str, Any]]:
    """The stream's header and what its chunks add up to (content, tool calls, finish reason)."""
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=messages, temperature=0, stream=True, **kw
    )  # type: ignore[call-overload]
    text, calls, finish = [], {}, None
    for chunk in raw.parse():
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or ():
                got = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                got["id"] = call.id or got["id"]
                got["name"] = (call.function.name if call.function else None) or got["name"]
                got["arguments"] += (call.function.arguments if call.function else None) or ""
            finish = choice.finish_reason or finish
    return raw.headers.get("x-switchyard-cache", ""), {
        "content": "".join(text),
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
    }


def of_json(body: bytes) -> dict[str, Any]:
    message = json.loads(body)["choices"][0]
    calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message["message"].get("tool_calls") or ()
    ]
    return {
        "content": message["message"].get("content") or "",
        "tool_calls": calls,
        "finish_reason": message["finish_reason"],
    }


def test_a_repeated_chat_request_is_the_stored_answer_byte_for_byte_and_calls_no_upstream(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = len(entries(redis_url))
    first_header, first = chat(client, messages)
    assert first_header == "store"
    wait_stored(redis_url, before)
    calls = upstream_calls(sim)
    # Key order and whitespace do not split entries: the same request written otherwise hits.
    header, again = chat(client, [{"content": messages[0]["content"], "role": "user"}])
    assert header == "hit"
    assert again == first
    assert upstream_calls(sim) == calls


def test_a_stream_stored_answer_replays_as_stream_and_as_json_with_the_same_tool_calls(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = len(entries(redis_url))
    header, original = stream_chat(client, messages, tools=[TOOL], tool_choice="required")
    assert header == "store" and original["finish_reason"] == "tool_calls" and original["tool_calls"]
    wait_stored(redis_url, before)
    calls = upstream_calls(sim)
    header, replayed = stream_chat(client, messages, tools=[TOOL], tool_choice="required")
    assert header == "hit"
    assert replayed == original
    header, body = chat(client, messages, tools=[TOOL], tool_choice="required")
    assert header == "hit"
    assert of_json(body) == original
    assert upstream_calls(sim) == calls


def test_a_json_stored_text_answer_replays_as_a_stream_with_usage(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = len(entries(redis_url))
    _, body = chat(client, messages)
    wait_stored(redis_url, before)
    stored = json.loads(body)
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=messages, temperature=0, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[call-overload]
    chunks = list(raw.parse())
    assert raw.headers["x-switchyard-cache"] == "hit"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == of_json(body)["content"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump(exclude_none=True) == stored["usage"]


@pytest.mark.parametrize("model", ["fast", "strong"])
def test_responses_api_hits_in_either_form_whichever_form_stored_it(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str, model: str
) -> None:
    """``fast`` is translated to chat completions, ``strong`` passed through natively."""
    client = oai(gateway, keys["team-b"])
    prompt = f"responses {uuid.uuid4().hex}"
    before = len(entries(redis_url))
    with client.responses.stream(model=model, input=prompt, temperature=0) as stream:
        original = stream.get_final_response()
    wait_stored(redis_url, before)
    calls = upstream_calls(sim)
    raw = client.responses.with_raw_response.create(model=model, input=prompt, temperature=0)
    assert raw.headers["x-switchyard-cache"] == "hit"
    again = raw.parse()
    assert again.output_text == original.output_text and again.status == original.status
    with client.responses.stream(model=model, input=prompt, temperature=0) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        replayed = stream.get_final_response()
    assert "".join(texts) == original.output_text == replayed.output_text
    assert replayed.usage is not None and original.usage is not None
    assert replayed.usage.output_tokens == original.usage.output_tokens
    assert upstream_calls(sim) == calls


def test_anthropic_messages_hit_in_stream_and_json_forms(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=keys["team-b"], max_retries=0, timeout=15)
    messages = [{"role": "user", "content": f"anthropic {uuid.uuid4().hex}"}]
    before = len(entries(redis_url))
    first = client.messages.with_raw_response.create(
        model="fast",
        max_tokens=200,
        messages=messages,
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    )
    assert first.headers["x-switchyard-cache"] == "store"
    original = first.parse()
    wait_stored(redis_url, before)
    calls = upstream_calls(sim)
    with client.messages.stream(
        model="fast",
        max_tokens=200,
        messages=messages,
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == original.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == original.stop_reason
    assert final.usage.output_tokens == original.usage.output_tokens
    assert upstream_calls(sim) == calls


def test_an_entry_is_served_only_within_its_namespace(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    messages = ask()
    before = len(entries(redis_url))
    header, stored = chat(oai(gateway, keys["team-a1"]), messages)
    assert header == "store"
    wait_stored(redis_url, before)
    # Another tenant asking the same thing gets its own miss: upstream is called.
    calls = upstream_calls(sim)
    header, _ = chat(oai(gateway, keys["team-b"]), messages)
    assert header == "store" and upstream_calls(sim) == calls + 1
    # A key sharing the operator-set namespace is served the entry.
    header, shared = chat(oai(gateway, keys["team-a2"]), messages)
    assert header == "hit" and shared == stored
    # A key denied the cache neither reads nor writes it.
    header, _ = chat(oai(gateway, keys["denied"]), messages)
    assert header == "" and upstream_calls(sim) == calls + 2


@pytest.mark.parametrize(
    "case",
    ["temperature", "n", "length", "no-store", "bad_json", "error", "cut_stream"],
)
def test_answers_that_must_not_be_kept_are_never_stored(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str, case: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    kw: dict[str, Any] = {"model": "fast", "messages": messages, "temperature": 0}
    headers: dict[str, str] = {}
    expected = "miss"
    if case == "temperature":
        kw["temperature"], expected = 0.7, "bypass"
    elif case == "n":
        kw["n"], expected = 2, "bypass"
    elif case == "length":
        kw["max_tokens"] = 2
    elif case == "no-store":
        headers["Cache-Control"] = "no-store"
    elif case == "bad_json":
        kw["response_format"] = {"type": "json_object"}
        sim.set_fault("sim-fast", "bad_json", count=1)
    elif case == "error":
        sim.set_fault("sim-fast", "error=400", count=1)
    elif case == "cut_stream":
        # The headers leave before the end: the stream said it would be kept if it ended whole.
        kw["stream"], expected = True, "store"
        sim.set_fault("sim-fast", "reset_mid_stream=1", count=1)
    before = entries(redis_url)
    try:
        raw = client.chat.completions.with_raw_response.create(**kw, extra_headers=headers)
        assert raw.headers["x-switchyard-cache"] == expected
        if case == "cut_stream":
            with pytest.raises(openai.APIError):
                list(raw.parse())
    except openai.BadRequestError:
        assert case == "error"
    finally:
        sim.clear_faults()
    time.sleep(0.3)
    assert entries(redis_url) == before


def test_client_bypass_skips_the_lookup_and_refresh_replaces_the_entry(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = len(entries(redis_url))
    chat(client, messages)
    wait_stored(redis_url, before)
    calls = upstream_calls(sim)
    header, _ = chat(client, messages, extra_headers={"Cache-Control": "no-cache"})
    assert header == "store" and upstream_calls(sim) == calls + 1
    header, _ = chat(client, messages, extra_headers={"x-switchyard-cache": "refresh"})
    assert header == "store" and upstream_calls(sim) == calls + 2
    header, _ = chat(client, messages)
    assert header == "hit" and upstream_calls(sim) == calls + 2


def test_a_corrupt_entry_is_a_miss_and_is_deleted(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = entries(redis_url)
    chat(client, messages)
    wait_stored(redis_url, len(before))
    [key] = set(entries(redis_url)) - set(before)
    r = redis.Redis.from_url(redis_url)
    r.set(key, b'{"v": 1, "kind": "chat"}\n{not json')
    calls = upstream_calls(sim)
    header, body = chat(client, messages)
    assert header == "store" and json.loads(body)["choices"]
    assert upstream_calls(sim) == calls + 1
    # Deleted, then stored again from the fresh answer.
    deadline = time.monotonic() + 5
    while (r.get(key) or b"").endswith(b"{not json"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    header, _ = chat(client, messages)
    assert header == "hit"


def test_cache_counters_show_hits_and_money_saved(
    gateway: GatewayProcess, keys: dict[str, str], redis_url: str, tmp_path: Path
) -> None:
    client = oai(gateway, keys["team-b"])
    messages = ask()
    before = len(entries(redis_url))
    chat(client, messages)
    wait_stored(redis_url, before)
    chat(client, messages)
    deadline = time.monotonic() + 5
    while True:
        status, stats = admin(gateway, "GET", "/admin/stats?since=10m")
        assert status == 200
        row = stats["deployments"].get("sim-fast", {})
        if row.get("rc_hits"):
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert row["rc_stores"] >= 1 and row["rc_saved_usd"] > 0 and row["rc_saved_tokens"] > 0


def switchyard(redis_url: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--redis-url", redis_url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=True,
    )
    return out.stdout


@pytest.mark.slow
def test_metrics_stats_and_the_cache_command_show_and_purge_entries(
    gateway: GatewayProcess, keys: dict[str, str], redis_url: str
) -> None:
    client = oai(gateway, keys["team-a1"])
    messages = ask()
    before = len(entries(redis_url))
    chat(client, messages)
    wait_stored(redis_url, before)
    assert chat(client, messages)[0] == "hit"
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(gateway.url + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        if 'switchyard_response_cache_total{deployment="sim-fast",outcome="hit"}' in metrics:
            break
        assert time.monotonic() < deadline, metrics[-3000:]
        time.sleep(0.1)
    assert "switchyard_response_cache_saved_usd_total" in metrics
    # The stats reach Redis with the writer's next flush: wait for it, as for the metrics.
    deadline = time.monotonic() + 5
    while True:
        _, report = admin(gateway, "GET", "/admin/stats?since=10m")
        if "Response cache" in render(report):
            break
        assert time.monotonic() < deadline, render(report)
        time.sleep(0.1)
    listed = json.loads(switchyard(redis_url, "cache", "list", "--namespace", "team-a", "--json"))
    assert listed and {row["namespace"] for row in listed} == {"team-a"}
    inspected = json.loads(switchyard(redis_url, "cache", "inspect", listed[0]["id"]))
    assert inspected["answer"]["choices"] and inspected["deployment"] == "sim-fast"
    mine = keys["team-a1:id"]
    assert "deleted" in switchyard(redis_url, "cache", "purge", "--key", mine)
    assert all(row["key_id"] != mine for row in json.loads(switchyard(redis_url, "cache", "list", "--json")))
    switchyard(redis_url, "cache", "purge", "--namespace", "team-a")
    assert json.loads(switchyard(redis_url, "cache", "list", "--namespace", "team-a", "--json")) == []
    assert chat(client, messages)[0] == "store"


RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": TOOL["function"]["parameters"],  # type: ignore[index]
}


@pytest.mark.parametrize("model", ["fast", "strong"])
def test_responses_function_calls_replay_the_same_calls(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str, model: str
) -> None:
    client = oai(gateway, keys["team-b"])
    kw: dict[str, Any] = {
        "model": model,
        "input": f"weather {uuid.uuid4().hex}",
        "temperature": 0,
        "tools": [RESPONSES_TOOL],
        "tool_choice": "required",
    }
    before = len(entries(redis_url))
    original = client.responses.create(**kw)
    calls = [(o.name, o.arguments, o.call_id) for o in original.output if o.type == "function_call"]
    assert calls
    wait_stored(redis_url, before)
    upstream = upstream_calls(sim)
    with client.responses.stream(**kw) as stream:
        replayed = stream.get_final_response()
    assert [(o.name, o.arguments, o.call_id) for o in replayed.output if o.type == "function_call"] == calls
    again = client.responses.create(**kw)
    assert [(o.name, o.arguments, o.call_id) for o in again.output if o.type == "function_call"] == calls
    assert upstream_calls(sim) == upstream


def test_anthropic_tool_use_replays_as_the_same_blocks(
    gateway: GatewayProcess, keys: dict[str, str], sim: SimServer, redis_url: str
) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=keys["team-b"], max_retries=0, timeout=15)
    kw: dict[str, Any] = {
        "model": "fast",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": f"weather {uuid.uuid4().hex}"}],
        "tools": [
            {
                "name": "get_weather",
                "description": "The weather",
                "input_schema": TOOL["function"]["parameters"],
            }
        ],  # type: ignore[index]
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    before = len(entries(redis_url))
    with client.messages.stream(**kw) as stream:
        original = stream.get_final_message()
    blocks = [(b.name, b.input, b.id) for b in original.content if b.type == "tool_use"]
    assert blocks and original.stop_reason == "tool_use"
    wait_stored(redis_url, before)
    upstream = upstream_calls(sim)
    again = client.messages.create(**kw)
    assert [(b.name, b.input, b.id) for b in again.content if b.type == "tool_use"] == blocks
    assert again.stop_reason == "tool_use"
    with client.messages.stream(**kw) as stream:
        replayed = stream.get_final_message()
    assert [(b.name, b.input, b.id) for b in replayed.content if b.type == "tool_use"] == blocks
    assert upstream_calls(sim) == upstream


def test_a_hit_is_not_shaped_and_counts_under_its_entrys_template(
    gateway: GatewayProcess, keys: dict[str, str], redis_url: str
) -> None:
    # Nothing of a hit goes upstream: shaping it would be work for nothing. The miss that
    # stored the entry was shaped (its header says so); the hit is not, and still counts in
    # the stats under the template the entry was stored with.
    client = oai(gateway, keys["team-b"])
    template = f"tpl-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "system", "content": "You are terse. Today is Monday."}, *ask()]
    extra = {"x-switchyard-template": template}
    before = len(entries(redis_url))
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=messages, temperature=0, extra_headers=extra
    )  # type: ignore[call-overload]
    assert raw.headers.get("x-switchyard-cache") == "store"
    assert raw.headers.get("x-switchyard-shaping")
    wait_stored(redis_url, before)
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=messages, temperature=0, extra_headers=extra
    )  # type: ignore[call-overload]
    assert raw.headers.get("x-switchyard-cache") == "hit"
    assert raw.headers.get("x-switchyard-shaping") is None
    deadline = time.monotonic() + 5
    while True:
        _, stats = admin(gateway, "GET", "/admin/stats?since=10m")
        row = next((t for t in stats.get("templates", []) if t["template"] == template), {})
        if row.get("rc_hits"):
            break
        assert time.monotonic() < deadline, stats.get("templates")
        time.sleep(0.1)
    assert row["rc_hits"] == 1 and row["rc_stores"] == 1
