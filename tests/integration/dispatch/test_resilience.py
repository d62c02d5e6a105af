"""Retries, fallbacks, timeouts, mid-stream integrity, circuits and hedging, each through a real fault."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer

MESSAGES = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimServer, SimServer]]:
    with SimServer("--model", "a:5:1") as a, SimServer("--model", "b:5:1") as b:
        yield a, b


def two_deployments(a: SimServer, b: SimServer, dispatch: str, tiers: str | None = None) -> str:
    return f"""
deployments:
  a: {{base_url: "{a.base_url}"}}
  b: {{base_url: "{b.base_url}"}}
tiers:
{tiers or "  fast: [a]" + chr(10) + "  strong: [b]"}
dispatch:
{dispatch}
"""


@pytest.fixture()
def clean(sims: tuple[SimServer, SimServer]) -> tuple[SimServer, SimServer]:
    for sim in sims:
        sim.reset()
    return sims


def client(gw: GatewayProcess, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gw.base_url, api_key="x", max_retries=kwargs.pop("max_retries", 0), **kwargs
    )


def admin(gw: GatewayProcess, path: str) -> Any:
    with urllib.request.urlopen(gw.url + path, timeout=5) as resp:
        return json.loads(resp.read())


def requests_seen(sim: SimServer) -> int:
    return int(sim.stats()["requests_total"])


def test_500_then_success_is_retried(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 2, backoff: {base_s: 0.01}}"))
    a.set_fault("a", "error=500", count=1)
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-switchyard-attempts"] == "2"
    assert raw.headers["x-switchyard-model"] == "a"
    assert requests_seen(a) == 2


def test_retry_after_is_honoured(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 2, backoff: {base_s: 0.01}}"))
    a.set_fault("a", "rate_limit=1", count=1)
    t0 = time.monotonic()
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert time.monotonic() - t0 >= 1.0
    assert raw.headers["x-switchyard-attempts"] == "2"


def test_retry_after_beyond_the_cap_is_returned_at_once(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 2, retry_after_cap_s: 2}"))
    a.set_fault("a", "rate_limit=30", count=1)
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as info:
        client(gw).chat.completions.create(model="fast", messages=MESSAGES)
    assert time.monotonic() - t0 < 1.0
    assert info.value.response.headers["retry-after"] == "30"
    assert info.value.response.headers["x-should-retry"] == "false"


def test_sdk_retries_do_not_multiply_gateway_retries(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 1, backoff: {base_s: 0.01}}"))
    a.set_fault("a", "error=500")
    with pytest.raises(openai.InternalServerError):
        # The SDK's own default is 2 retries; the gateway's answer tells it not to.
        client(gw, max_retries=2).chat.completions.create(model="fast", messages=MESSAGES)
    assert requests_seen(a) == 2  # one attempt and one gateway retry, not 3 x 2


def test_hang_before_first_token_falls_back(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    dispatch = "  timeouts: {first_token_s: 0.5}\n  fallback: {strong: [fast]}"
    gw = make_gateway(two_deployments(a, b, dispatch))
    b.set_fault("b", "hang")
    t0 = time.monotonic()
    stream = client(gw).chat.completions.with_raw_response.create(
        model="strong", messages=MESSAGES, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    assert text and time.monotonic() - t0 < 3
    assert stream.headers["x-switchyard-model"] == "a"
    assert stream.headers["x-switchyard-fallback"] == "fast"
    assert stream.headers["x-switchyard-attempts"] == "2"
    line = gw.wait_log(lambda entry: entry.get("event") == "request" and entry.get("status") == 200)
    assert line["deployment"] == "a" and line["attempts"] == 2


def test_first_token_timeout_without_fallback_is_504(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  timeouts: {first_token_s: 0.3}\n  retries: {max: 0}"))
    a.set_fault("a", "slow_first_token=2000")
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(model="fast", messages=MESSAGES, stream=True)
    assert info.value.status_code == 504 and info.value.code == "first_token_timeout"


def test_request_header_tightens_the_first_token_timeout(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 0}"))
    a.set_fault("a", "slow_first_token=2000")
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(
            model="fast",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-switchyard-timeout": "first_token_s=0.3"},
        )
    assert info.value.code == "first_token_timeout" and time.monotonic() - t0 < 1.5
    with pytest.raises(openai.BadRequestError):
        client(gw).chat.completions.create(
            model="fast", messages=MESSAGES, extra_headers={"x-switchyard-timeout": "soon"}
        )


@pytest.mark.parametrize(
    ("fault", "dispatch", "code"),
    [
        ("reset_mid_stream=3", "  retries: {max: 2}", "upstream_disconnected"),
        ("stall_mid_stream=3", "  timeouts: {idle_s: 0.4}\n  retries: {max: 2}", "idle_timeout"),
        # The pause after 2 chunks puts them on the wire first: on a loaded machine the simulator
        # would otherwise write a late answer whole, and the gateway, rightly, retry it before
        # anything reached the client.
        ("stall_mid_stream=2:300,malformed_chunk=3", "  retries: {max: 2}", "malformed_chunk"),
    ],
)
def test_a_stream_broken_after_it_began_ends_with_an_error_event(
    make_gateway: Any, clean: tuple[SimServer, SimServer], fault: str, dispatch: str, code: str
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, dispatch))
    a.set_fault("a", fault, count=1)
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client(gw).chat.completions.create(
            model="fast", messages=MESSAGES, stream=True, max_tokens=30
        ):
            received.append(chunk)
    assert len(received) >= 3, "what came before the break reached the client"
    assert info.value.body["code"] == code  # type: ignore[index]
    assert requests_seen(a) == 1, "no retry once bytes went to the client"


def test_malformed_first_event_is_retried_before_anything_is_sent(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 1, backoff: {base_s: 0.01}}"))
    a.set_fault("a", "malformed_chunk=0", count=1)
    chunks = list(client(gw).chat.completions.create(model="fast", messages=MESSAGES, stream=True))
    assert chunks[-1].choices[0].finish_reason is not None
    assert requests_seen(a) == 2


def test_non_stream_retries_whole(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  retries: {max: 1, backoff: {base_s: 0.01}}"))
    a.set_fault("a", "reset_mid_stream=2", count=1)
    reply = client(gw).chat.completions.create(model="fast", messages=MESSAGES)
    assert reply.choices[0].message.content
    assert requests_seen(a) == 2


def test_circuit_opens_after_failures_and_closes_after_the_cooldown(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    dispatch = (
        "  retries: {max: 1, backoff: {base_s: 0.01}}\n  circuit: {consecutive_failures: 3, cooldown_s: 1}"
    )
    gw = make_gateway(two_deployments(a, b, dispatch, tiers="  fast: [a, b]"))
    a.set_fault("a", "error=500")
    c = client(gw)
    for _ in range(3):
        assert (
            c.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES).headers[
                "x-switchyard-model"
            ]
            == "b"
        )
    assert admin(gw, "/admin/dispatch")["circuits"]["a"]["state"] == "open"
    seen = requests_seen(a)
    raw = c.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert raw.headers["x-switchyard-attempts"] == "1" and raw.headers["x-switchyard-model"] == "b"
    assert requests_seen(a) == seen, "an open circuit is not even tried"
    a.clear_faults()
    time.sleep(1.2)
    raw = c.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert raw.headers["x-switchyard-model"] == "a"  # the half-open probe, which succeeds
    assert admin(gw, "/admin/dispatch")["circuits"]["a"]["state"] == "closed"


@pytest.mark.slow
def test_an_open_circuit_is_shared_with_other_replicas(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    dispatch = (
        "  retries: {max: 1, backoff: {base_s: 0.01}}\n  circuit: {consecutive_failures: 2, cooldown_s: 30}"
    )
    policy = two_deployments(a, b, dispatch, tiers="  fast: [a, b]")
    first = make_gateway(policy)
    second = make_gateway(policy, flush_redis=False)
    a.set_fault("a", "error=500")
    for _ in range(2):
        client(first).chat.completions.create(model="fast", messages=MESSAGES)
    deadline = time.monotonic() + 5
    while admin(second, "/admin/dispatch")["circuits"].get("a", {}).get("state") != "open":
        assert time.monotonic() < deadline, "the second replica never saw the open circuit"
        time.sleep(0.1)
    assert admin(second, "/admin/dispatch")["circuits"]["a"]["opened_by"] == "shared"
    seen = requests_seen(a)
    assert (
        client(second)
        .chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
        .headers["x-switchyard-model"]
        == "b"
    )
    assert requests_seen(a) == seen


def test_retry_budget_stops_a_storm(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    dispatch = (
        "  retries: {max: 3, backoff: {base_s: 0}, budget: {ratio: 0.1, min_per_s: 0, window_s: 60}}\n"
        "  circuit: {enabled: false}"
    )
    gw = make_gateway(two_deployments(a, b, dispatch))
    a.set_fault("a", "error=500")
    c = client(gw)
    for _ in range(20):
        with pytest.raises(openai.InternalServerError):
            c.chat.completions.create(model="fast", messages=MESSAGES)
    # Without a budget: 20 x 4 attempts. With 10 %: about 2 retries in all.
    assert requests_seen(a) <= 23
    status = admin(gw, "/admin/dispatch")
    assert status["retry_budget"]["refused"] >= 15 and status["counters"]["retries"] <= 3


def test_hedge_wins_and_the_losers_connection_is_closed(make_gateway: Any) -> None:
    with SimServer("--model", "slow:1500:1") as slow, SimServer("--model", "quick:20:1") as quick:
        policy = f"""
deployments:
  slow: {{base_url: "{slow.base_url}"}}
  quick: {{base_url: "{quick.base_url}"}}
tiers:
  fast: [slow, quick]
dispatch:
  hedge: {{enabled: true, after_s: 0.2, budget_ratio: 1.0}}
"""
        gw = make_gateway(policy)
        t0 = time.monotonic()
        raw = client(gw).chat.completions.with_raw_response.create(
            model="fast", messages=MESSAGES, stream=True
        )
        chunks = list(raw.parse())
        assert chunks and time.monotonic() - t0 < 1.2
        assert raw.headers["x-switchyard-model"] == "quick"
        assert raw.headers["x-switchyard-hedged"] == "true"
        assert raw.headers["x-switchyard-attempts"] == "2"
        deadline = time.monotonic() + 3
        while slow.stats()["cancelled"] != 1:
            assert time.monotonic() < deadline, slow.stats()
            time.sleep(0.05)
        counters = admin(gw, "/admin/dispatch")["counters"]
        assert counters["hedges"] == 1 and counters["hedges_won"] == 1
        # Non-stream: the same, with the whole answer as the finish line.
        raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
        assert raw.headers["x-switchyard-model"] == "quick"


def test_no_hedge_when_the_first_attempt_is_fast(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(two_deployments(a, b, "  hedge: {enabled: true, after_s: 1}", tiers="  fast: [a, b]"))
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert "x-switchyard-hedged" not in raw.headers
    assert requests_seen(b) == 0


def test_unknown_fallback_tier_is_rejected(tmp_path: Any) -> None:
    from gateway.config import PolicyError, parse_policy

    with pytest.raises(PolicyError) as info:
        parse_policy(
            "deployments: {a: {base_url: 'http://x'}}\ntiers: {fast: [a]}\ndispatch: {fallback: {fast: [nope]}}\n",
            "p",
        )
    assert [i.path for i in info.value.issues] == ["dispatch.fallback.fast[0]"]
