"""Cost per request from the provider's usage, cached tokens at the cached price; totals per day, key, model."""

from __future__ import annotations

import time
from typing import Any

import openai

from tests.helpers import SimServer
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

PRICE = {"input": 2.0, "cached_input": 0.5, "output": 8.0}
# Long enough to fill several 16-token cache blocks of the simulator.
SYSTEM = "You are a careful assistant for a shipping company. " * 12


def test_cost_counts_cached_tokens_once_and_adds_up_per_key_model_and_day(
    sim: SimServer, make_gateway: Any
) -> None:
    policy = f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim.base_url}", price: {{input: 2.0, cached_input: 0.5, output: 8.0}}}}
tiers: {{fast: [sim-fast]}}
"""
    gw = make_gateway(policy, env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY})
    _, made = admin(gw, "POST", "/admin/keys", {"name": "billing"})
    client = openai.OpenAI(base_url=gw.base_url, api_key=made["key"], max_retries=0)
    expected = 0.0
    cached_seen = 0
    for question in ("Where is my parcel?", "Where is my parcel now?", "Can I change the address?"):
        reply = client.chat.completions.create(
            model="fast",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        )
        usage = reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        cached_seen += cached
        expected += (
            (usage.prompt_tokens - cached) * PRICE["input"]
            + cached * PRICE["cached_input"]
            + usage.completion_tokens * PRICE["output"]
        ) / 1e6
    assert cached_seen > 0, "the simulator should have reported cached tokens on the repeats"

    def day_total() -> Any:
        return admin(gw, "GET", "/admin/costs?days=2")[1]["days"][0]

    deadline = time.monotonic() + 3
    while day_total()["requests"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    today = day_total()
    assert today["day"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert abs(today["cost_usd"] - expected) < 1e-8
    assert abs(today["keys"][made["id"]]["cost_usd"] - expected) < 1e-8
    assert abs(today["deployments"]["sim-fast"]["cost_usd"] - expected) < 1e-8
    assert today["cached_tokens"] == cached_seen

    def request_lines() -> list[Any]:
        return [line for line in gw.log_lines() if line.get("event") == "request"]

    # The log is written by its own thread: the third line may still be on its way.
    while len(request_lines()) < 3:
        assert time.monotonic() < deadline + 3
        time.sleep(0.1)
    assert abs(sum(line["cost_usd"] for line in request_lines()) - expected) < 1e-8
    stats = admin(gw, "GET", "/admin/stats?since=5m")[1]
    assert abs(stats["keys"][made["id"]]["cost_usd"] - expected) < 1e-8
    spend = next(r for r in admin(gw, "GET", "/admin/keys")[1]["data"] if r["id"] == made["id"])
    assert abs(spend["spend_usd"] - expected) < 1e-8
    assert admin(gw, "GET", "/admin/costs?days=zero")[0] == 400
