"""What a vLLM deployment's chat template accepts, asked through its /tokenize (the simulator's
mimics vLLM's, with a template that takes a system message anywhere or only first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from gateway.shaping.probe import probe_placement
from tests.helpers import GatewayProcess, SimServer

RULES = "\n".join(f"Rule {n}: answer questions about Acme's orders precisely." for n in range(40))


@pytest.fixture(scope="module")
def lenient() -> Iterator[SimServer]:
    with SimServer("--model", "llama:2:1", "--output-tokens", "4", "--template", "any") as server:
        yield server


@pytest.fixture(scope="module")
def strict() -> Iterator[SimServer]:
    with SimServer("--model", "llama:2:1", "--output-tokens", "4", "--template", "first") as server:
        yield server


def _probe(base_url: str) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            return await probe_placement(session, base_url, "llama")

    return asyncio.run(run())


def test_the_probe_finds_the_latest_placement_the_template_renders(
    lenient: SimServer, strict: SimServer
) -> None:
    assert _probe(lenient.base_url) == "after_last_turn"
    assert _probe(strict.base_url) == "end_of_system"
    assert _probe("http://127.0.0.1:9/v1") is None  # nothing answers: nothing known


def _policy(server: SimServer) -> str:
    return f"""
deployments:
  local:
    provider: vllm
    model: llama
    base_url: {server.base_url}
tiers:
  fast: [local]
"""


def _conversation(gw: GatewayProcess, minute: int) -> Any:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="fast",
        messages=[
            {"role": "system", "content": f"Current time: 12:{minute:02d}:00\n{RULES}"},
            {"role": "user", "content": "Where is my order?"},
            {"role": "assistant", "content": "It left on Monday."},
            {"role": "user", "content": f"And now, at minute {minute}?"},
        ],
        max_tokens=4,
    )


def _late_placement(gw: GatewayProcess, timeout_s: float = 10.0) -> str:
    """The shaping header of a conversation's turns, once the probe answered (or the time ran out)."""
    deadline = time.monotonic() + timeout_s
    minute = 0
    while True:
        raw = _conversation(gw, minute)
        header = raw.headers.get("x-switchyard-shaping", "")
        if "turn:" in header or time.monotonic() > deadline:
            return header
        minute += 1
        time.sleep(0.1)


def test_a_vllm_whose_template_takes_a_late_system_message_gets_one(
    lenient: SimServer, make_gateway: Any
) -> None:
    gw = make_gateway(_policy(lenient))
    # The time changes within the conversation: after the probe answered, it goes after the
    # newest turn (the default for vLLM without a probe keeps it in the system message).
    assert "turn:" in _late_placement(gw)


def test_a_vllm_whose_template_refuses_a_late_system_message_never_gets_one(
    strict: SimServer, make_gateway: Any
) -> None:
    gw = make_gateway(_policy(strict))
    header = _late_placement(gw, timeout_s=2.0)  # every request answered: none was refused
    assert "turn:" not in header and "to=end:" in header
