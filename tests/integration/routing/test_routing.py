"""`model: auto` through a running gateway: explained routes, the hint, escalation, reload."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy


def policy(sim: SimServer, routing: str) -> str:
    return sim_policy(sim.base_url, f"routing:\n{routing}", provider="openai")


ROUTING = """  rules:
    - {name: tools, when: {has_tools: true}, tier: strong}
  classifier: {name: linear, bias: -2.0, weights: {reasoning_cues: 10.0}}
  threshold: 0.5
  escalation: {enabled: true}"""


@pytest.fixture()
def gateway(sim: SimServer, make_gateway: Any) -> GatewayProcess:
    sim.reset()
    gw: GatewayProcess = make_gateway(policy(sim, ROUTING))
    return gw


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


def ask(gw: GatewayProcess, text: str, **extra: Any) -> Any:
    return client(gw).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], **extra
    )


def test_easy_and_hard_prompts_are_routed_and_explained(gateway: GatewayProcess) -> None:
    easy = ask(gateway, "Hello there")
    assert easy.headers["x-switchyard-model"] == "sim-fast"
    assert easy.headers["x-switchyard-route"] == "tier=fast; score=0.12; threshold=0.5"
    hard = ask(gateway, "Prove it and explain why")
    assert hard.headers["x-switchyard-model"] == "sim-strong"
    assert hard.headers["x-switchyard-route"].startswith("tier=strong; score=")
    tools = ask(
        gateway,
        "hi",
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    )
    assert tools.headers["x-switchyard-route"] == "tier=strong; by=rule:tools"


def test_hint_by_header_or_metadata_and_metadata_key_not_forwarded(
    gateway: GatewayProcess, sim: SimServer
) -> None:
    raw = ask(gateway, "Prove it", extra_headers={"x-switchyard-tier": "fast"})
    assert raw.headers["x-switchyard-route"] == "tier=fast; by=hint"
    raw = ask(gateway, "hello", metadata={"switchyard_tier": "strong"})
    assert raw.headers["x-switchyard-route"] == "tier=strong; by=hint"
    assert "metadata" not in sim.stats()["recent"][-1]["body_keys"]
    ask(gateway, "hello", metadata={"switchyard_tier": "strong", "team": "a"})
    assert "metadata" in sim.stats()["recent"][-1]["body_keys"]


@pytest.mark.parametrize(
    ("fault", "extra", "reason"),
    [
        ("bad_json", {"response_format": {"type": "json_object"}}, "invalid_json"),
        ("empty", {}, "empty"),
        ("length", {}, "length"),
    ],
)
def test_a_failed_fast_answer_escalates_once_to_strong(
    gateway: GatewayProcess, sim: SimServer, fault: str, extra: dict[str, Any], reason: str
) -> None:
    sim.set_fault("sim-fast", fault, count=1)
    raw = ask(gateway, "Hello there", **extra)
    assert raw.headers["x-switchyard-escalated"] == reason
    assert raw.headers["x-switchyard-model"] == "sim-strong"
    assert raw.headers["x-switchyard-route"] == f"tier=strong; by=escalation:{reason}; from=fast"
    assert raw.parse().choices[0].message.content
    models = [r["model"] for r in sim.stats()["recent"][-2:]]
    assert models == ["sim-fast", "sim-strong"]


def test_no_escalation_when_the_client_set_the_limit_or_the_answer_is_fine(
    gateway: GatewayProcess, sim: SimServer
) -> None:
    sim.set_fault("sim-fast", "length", count=1)
    raw = ask(gateway, "Hello there", max_tokens=3)
    assert "x-switchyard-escalated" not in raw.headers
    raw = ask(gateway, "Hello there", response_format={"type": "json_object"})
    assert "x-switchyard-escalated" not in raw.headers and json.loads(
        raw.parse().choices[0].message.content or ""
    )


def readyz(gw: GatewayProcess) -> Any:
    with urllib.request.urlopen(gw.url + "/readyz", timeout=5) as resp:
        return json.loads(resp.read())


def test_a_malformed_routing_block_on_reload_keeps_the_old_policy(
    gateway: GatewayProcess, sim: SimServer
) -> None:
    gateway.write_policy(policy(sim, "  threshold: 1.7\n  rules: [{when: {vibes: 1}, tier: strong}]"))
    deadline = time.monotonic() + 5
    while readyz(gateway)["policy"]["reload_error"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    errors = readyz(gateway)["policy"]["reload_error"]
    assert any("routing.threshold" in e for e in errors) and any("routing.rules[0].when" in e for e in errors)
    assert (
        ask(gateway, "Prove it").headers["x-switchyard-model"] == "sim-strong"
    )  # the old classifier still routes


def test_the_shipped_ngram_classifier_routes_auto_by_what_is_asked(sim: SimServer, make_gateway: Any) -> None:
    sim.reset()
    gw: GatewayProcess = make_gateway(policy(sim, "  classifier: {name: ngram}\n  threshold: 0.5"))
    short = ask(gw, "hi")
    assert short.headers["x-switchyard-route"].startswith("tier=fast; score=")
    long_question = (
        "A train leaves the station at 3 pm travelling at 60 miles per hour, and a second train leaves "
        "the same station two hours later at 80 miles per hour on a parallel track. Each stop costs "
        "the first train 12 minutes and there are four stops before the city. How many miles from the "
        "station does the second train catch up, and at what time? Show each step of the calculation."
    ) * 3
    scores = [float(ask(gw, t).headers["x-switchyard-route"].split("score=")[1].split(";")[0])
              for t in ("hi", long_question)]  # fmt: skip
    assert scores[1] > scores[0]
