"""The openai SDK through the gateway to an Anthropic deployment: chat completions translated
to the Messages API and back, stream and tools included, cache usage and cost."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer
from tests.integration.gateway.test_keys import admin

SYSTEM = "You are the dispatcher of a small harbor; answer tersely and name the berth. " * 60
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "berth", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture()
def client(gateway: GatewayProcess, key: str) -> Any:
    with openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=15) as c:
        yield c


def test_chat_answer_and_cached_usage_from_the_gateways_breakpoints(
    client: openai.OpenAI, both_sim: SimServer
) -> None:
    both_sim.reset()
    replies = [
        client.chat.completions.create(
            model="claude",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=32,
        )
        for question in ("Which berth for the ferry?", "Which berth for the tug?")
    ]
    first, second = replies
    assert first.object == "chat.completion" and first.choices[0].message.content
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    assert (
        second.usage.prompt_tokens_details.cached_tokens
        and second.usage.prompt_tokens_details.cached_tokens > 1000
    )
    assert first.usage.prompt_tokens_details is not None
    # The openai SDK knows the field: prompt_tokens_details.cache_write_tokens.
    written = getattr(first.usage.prompt_tokens_details, "cache_write_tokens", None)
    assert written == second.usage.prompt_tokens_details.cached_tokens
    marks = both_sim.stats()["recent"][-1]
    assert marks["cached_tokens"] == second.usage.prompt_tokens_details.cached_tokens


def test_stream_with_tool_call_deltas_and_done(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="claude",
        messages=[{"role": "user", "content": "Where does the ferry go?"}],
        tools=TOOLS,
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0][0].function.name == "berth" and calls[0][0].id
    arguments = "".join(call[0].function.arguments or "" for call in calls)
    assert json.loads(arguments) == {}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_unsupported_parameters_are_a_clear_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="claude",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_object"},
        )
    assert bad.value.code == "unsupported_parameter" and "json_schema" in bad.value.message
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], n=2)
    assert many.value.param == "n"


def settled_costs(gateway: GatewayProcess) -> dict[str, Any]:
    """Today's cost figures once two reads 0.3 s apart agree."""
    last = admin(gateway, "GET", "/admin/costs?days=1")[1]["days"][0]
    deadline = time.monotonic() + 5
    while True:
        time.sleep(0.3)
        now = admin(gateway, "GET", "/admin/costs?days=1")[1]["days"][0]
        if now == last:
            return dict(now)
        assert time.monotonic() < deadline
        last = now


def test_cost_charges_cache_writes_at_their_premium(
    gateway: GatewayProcess, key: str, both_sim: SimServer
) -> None:
    both_sim.reset()
    c = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    before = settled_costs(gateway)  # the module's earlier requests are counted off the request path
    reply = c.chat.completions.create(
        model="claude",
        messages=[{"role": "system", "content": SYSTEM + "v2"}, {"role": "user", "content": "hi"}],
    )
    usage = reply.usage
    assert usage is not None
    recent = both_sim.stats()["recent"][-1]
    written = usage.prompt_tokens - recent["cached_tokens"]
    assert written > 1000  # the first request writes the system prompt
    deadline = time.monotonic() + 5
    while True:
        after = admin(gateway, "GET", "/admin/costs?days=1")[1]["days"][0]
        if after["requests"] > before["requests"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    spent = after["cost_usd"] - before["cost_usd"]
    # Everything but the question's few tokens was written at 1.25x the 3.0 input price.
    assert spent > (written * 3.0 * 1.2 + usage.completion_tokens * 15.0) / 1e6


def test_openai_sampling_values_anthropic_refuses_are_a_clear_400(client: openai.OpenAI) -> None:
    ask: Any = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as hot:
        client.chat.completions.create(model="claude", messages=ask, temperature=1.5)
    assert (hot.value.param, hot.value.code) == ("temperature", "unsupported_parameter")  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(model="claude", messages=ask, temperature=0.5, top_p=0.9)
    assert (both.value.param, both.value.code) == ("top_p", "unsupported_parameter")  # type: ignore[attr-defined]
    # One of them is fine; the same request on the OpenAI-compatible deployment is too.
    assert client.chat.completions.create(model="claude", messages=ask, temperature=0.5).choices
    assert client.chat.completions.create(model="local", messages=ask, temperature=1.5, top_p=0.9).choices


def test_a_deployment_whose_model_takes_both_samplers_says_so(both_sim: SimServer, make_gateway: Any) -> None:
    from tests.integration.anthropic.conftest import policy

    gw = make_gateway(policy(both_sim, ", temperature_with_top_p: true"))
    with openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0, timeout=15) as c:
        answer = c.chat.completions.create(
            model="claude", messages=[{"role": "user", "content": "x"}], temperature=0.5, top_p=0.9
        )
    assert answer.choices[0].message.content
