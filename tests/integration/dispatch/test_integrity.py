"""Issue #13 through the official openai SDK, against simulators with the fault injected.

The rule every test states: a client never receives a truncated, empty or error answer as
a success, and never waits past the bound the policy sets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer
from tests.integration.dispatch.test_resilience import admin, client, requests_seen

MESSAGES: list[Any] = [{"role": "user", "content": "How does a server-sent event stream end?"}]
# a answers first; b is the fallback tier (or the second deployment of the tier).
WITH_FALLBACK = """
  timeouts: {first_token_s: 1, first_byte_s: 0.5, idle_s: 5}
  retries: {max: 2, backoff: {base_s: 0.01}}
  fallback: {fast: [strong]}
"""


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimServer, SimServer]]:
    with SimServer("--model", "a:5:1") as a, SimServer("--model", "b:5:1") as b:
        yield a, b


@pytest.fixture()
def clean(sims: tuple[SimServer, SimServer]) -> tuple[SimServer, SimServer]:
    for sim in sims:
        sim.reset()
    return sims


def policy(
    a: SimServer, b: SimServer, dispatch: str = WITH_FALLBACK, tiers: str = "  fast: [a]\n  strong: [b]"
) -> str:
    return f"""
deployments:
  a: {{base_url: "{a.base_url}"}}
  b: {{base_url: "{b.base_url}"}}
tiers:
{tiers}
dispatch:
{dispatch}
"""


def stream_text(gw: GatewayProcess) -> tuple[str, Any]:
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return text, raw.headers


def request_line(gw: GatewayProcess) -> dict[str, Any]:
    return gw.wait_log(lambda entry: entry.get("event") == "request")


# --- 1, 2: a stream that started and then went wrong ends with an error event ---------------


def test_done_inside_the_content_then_a_cut_is_an_error_and_nothing_is_held_back(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", "done_in_content")
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    stream = client(gw).chat.completions.create(model="fast", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append((time.monotonic() - t0, chunk.choices[0].delta.content))
    failed_at = time.monotonic() - t0
    assert info.value.code == "stream_incomplete"
    tricky_at = next(t for t, text in seen if "data: [DONE]" in text)
    assert failed_at - tricky_at > 0.2  # forwarded when it came, not held back until the end
    assert request_line(gw)["error_code"] == "stream_incomplete"


def test_an_event_ending_in_a_brace_but_invalid_ends_the_stream_with_an_error(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", "invalid_200")
    text = ""
    with pytest.raises(openai.APIError) as info:
        for chunk in client(gw).chat.completions.create(model="fast", messages=MESSAGES, stream=True):
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert info.value.code == "malformed_chunk"  # not a bare JSONDecodeError in the SDK
    assert text == "Hello"


# --- 3: non-stream 200s are validated before anything reaches the client -------------------


@pytest.mark.parametrize("fault", ["error_200", "truncated_200", "invalid_200", "empty_200"])
def test_a_bad_non_stream_200_falls_back(
    make_gateway: Any, clean: tuple[SimServer, SimServer], fault: str
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", fault)
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert raw.parse().choices[0].message.content
    assert (raw.headers["x-switchyard-model"], raw.headers["x-switchyard-attempts"]) == ("b", "2")
    circuit = admin(gw, "/readyz")["circuits"]["a"]
    assert circuit["window_failures"] == 1 and circuit["last_failure"] in (
        "error_answer",
        "invalid_answer",
        "empty_answer",
    )


def test_a_bad_non_stream_200_with_nowhere_to_go_is_a_502(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b, "  retries: {max: 0}"))
    a.set_fault("a", "error_200")
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(model="fast", messages=MESSAGES)
    assert (info.value.status_code, info.value.code) == (502, "error_answer")
    line = request_line(gw)
    assert (line["status"], line["error_code"]) == (502, "error_answer")  # logged as the failure it is


def test_a_bad_embeddings_200_falls_back(make_gateway: Any, clean: tuple[SimServer, SimServer]) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", "truncated_200")
    raw = client(gw).embeddings.with_raw_response.create(model="fast", input="harbor")
    assert raw.parse().data[0].embedding and raw.headers["x-switchyard-model"] == "b"


# --- 4: a non-stream answer's first byte is bounded; total_s bounds the whole request ------


@pytest.mark.parametrize("fault", ["hang", "headers_hang"])
def test_a_hung_non_stream_upstream_falls_back_after_first_byte_s(
    make_gateway: Any, clean: tuple[SimServer, SimServer], fault: str
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", fault)
    t0 = time.monotonic()
    raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
    assert raw.parse().choices[0].message.content
    assert 0.5 <= time.monotonic() - t0 < 2.0
    assert raw.headers["x-switchyard-model"] == "b"


def test_total_s_bounds_the_whole_request_across_attempts(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    dispatch = (
        "  timeouts: {first_byte_s: 1, total_s: 1.5}\n  retries: {max: 3}\n  fallback: {fast: [strong]}"
    )
    gw = make_gateway(policy(a, b, dispatch))
    a.set_fault("a", "hang")
    b.set_fault("b", "headers_hang")
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client(gw).chat.completions.create(model="fast", messages=MESSAGES)
    assert time.monotonic() - t0 < 2.5  # 1.5 s and no more: not 3 x first_byte_s, not total_s per attempt
    assert info.value.status_code == 504 and info.value.code in ("total_timeout", "first_byte_timeout")


# --- 6: rejected credentials on one deployment fall back ------------------------------------


def test_a_401_on_one_deployment_falls_back_and_shows_on_readyz(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    dispatch = (
        "  retries: {max: 3, backoff: {base_s: 0.01}}\n  circuit: {consecutive_failures: 2, shared: false}"
    )
    gw = make_gateway(policy(a, b, dispatch, tiers="  fast: [a, b]\n  strong: [b]"))
    a.set_fault("a", "error=401")  # a's key was revoked; b's works
    for _ in range(2):
        raw = client(gw).chat.completions.with_raw_response.create(model="fast", messages=MESSAGES)
        assert raw.parse().choices[0].message.content and raw.headers["x-switchyard-model"] == "b"
    assert requests_seen(a) == 2  # once per request: never retried on the deployment that refused
    circuit = admin(gw, "/readyz")["circuits"]["a"]
    assert circuit["state"] == "open" and circuit["last_failure"] == "401"
    live = admin(gw, "/admin/dashboard")["live"]  # the dashboard's "Deployments now" panel
    assert (live["a"]["circuit"], live["a"]["last_failure"]) == ("open", "401")
    assert live["b"]["circuit"] == "closed" and live["b"]["healthy_replicas"] is None


# --- 7: stream failures before the first byte are retried -----------------------------------


@pytest.mark.parametrize("fault", ["empty_200", "error_200", "truncated_200"])
def test_a_stream_that_fails_before_its_first_byte_falls_back(
    make_gateway: Any, clean: tuple[SimServer, SimServer], fault: str
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))
    a.set_fault("a", fault)
    text, headers = stream_text(gw)
    assert text and (headers["x-switchyard-model"], headers["x-switchyard-attempts"]) == ("b", "2")


# --- 8: [DONE] ends the answer even when the upstream keeps the connection open -------------


def test_done_without_close_ends_the_stream_at_once_as_a_success(
    make_gateway: Any, clean: tuple[SimServer, SimServer]
) -> None:
    a, b = clean
    gw = make_gateway(policy(a, b))  # idle_s: 5
    a.set_fault("a", "done_no_close")
    t0 = time.monotonic()
    text, headers = stream_text(gw)
    assert text == "Hello" and headers["x-switchyard-model"] == "a"
    assert time.monotonic() - t0 < 1.0
    line = request_line(gw)
    assert line["status"] == 200 and line.get("error_code") is None
