"""``switchyard stats`` says per request what shaping moved, why and where to: an agent loop
through a running gateway, a real Redis and the simulator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import ROOT, SimServer, sim_policy
from tests.integration.shaping.test_shaping_stats import INSTRUCTIONS, stats

PLACEMENT = "shaping: {deployment_placement: {sim-fast: after_last_turn, sim-strong: after_last_turn}}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("--model", "sim-fast:5:1", "--model", "sim-strong:5:1", "--cache-model", "vllm") as server:
        yield server


def _step(messages: list[dict[str, Any]], second: int) -> list[dict[str, Any]]:
    system = f"Current time: 2026-12-03T10:42:{second:02d}Z\n" + INSTRUCTIONS
    return [{"role": "system", "content": system}, *messages]


def test_stats_say_per_request_what_moved_why_and_where(sim: SimServer, make_gateway: Any) -> None:
    sim.reset()
    gw = make_gateway(sim_policy(sim.base_url, PLACEMENT))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    headers = []
    for step in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="fast",
            messages=_step(history, step),
            max_tokens=4,  # type: ignore[arg-type]
        )
        headers.append(raw.headers["x-switchyard-shaping"])
        call_id = f"call_{step}"
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
                ],
            }
        )
        history.append({"role": "tool", "tool_call_id": call_id, "content": f"file {step}"})
    assert headers[0].endswith("to=end:1,user:0")
    assert headers[2].endswith("to=end:0,tool:1")
    report = stats(gw, lambda r: len(r.get("moved", [])) >= 3)
    newest, _, first = report["moved"]
    assert first["moves"] == [["line", "first turn", "end"]]
    assert newest["moves"] == [["line", "changes within the conversation", "tool"]]
    assert newest["deployment"] == "sim-fast" and newest["request_id"]
    env = {"SWITCHYARD_URL": gw.url, "PATH": "/usr/bin:/bin"}
    text = subprocess.run(
        [sys.executable, "-m", "gateway", "stats"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    ).stdout
    assert "What shaping moved (the last 3 shaped requests, newest first):" in text
    assert f"{newest['request_id']} sim-fast template {newest['template']}: line -> tool " in text
    assert "(changes within the conversation)" in text
