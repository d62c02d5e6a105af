"""The dispatcher end to end against MockTransport, on virtual time: retries, Retry-After,
the retry budget, fallback, hedging and circuit breakers, without a socket or a real sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.dispatch.dispatcher import Dispatcher
from gateway.errors import RateLimitError, UpstreamError, UpstreamStatusError, UpstreamUnavailableError
from gateway.providers.mock import MockRequest, MockResponse, MockTransport
from gateway.providers.pool import UpstreamPool
from gateway.routing.resolve import Route
from tests.unit.dispatch.virtual_time import LoopClock, run

Handler = Callable[[MockRequest], Awaitable[MockResponse]]
OK = {"id": "x", "object": "chat.completion", "model": "m", "choices": [], "usage": {"prompt_tokens": 3}}
BODY = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


def policy_yaml(dispatch: str = "{}") -> str:
    return f"""
deployments:
  a: {{provider: openai, base_url: "http://a/v1"}}
  b: {{provider: vllm, base_url: "http://b/v1"}}
  c: {{provider: openai, base_url: "http://c/v1"}}
tiers: {{fast: [a, b], strong: [c]}}
dispatch: {dispatch}
"""


class Setup:
    """A dispatcher whose deployments answer from handlers, and a context per request."""

    def __init__(self, handlers: dict[str, Handler], dispatch: str = "{}") -> None:
        self.policy = parse_policy(policy_yaml(dispatch), "test.yaml")
        self.snapshot = PolicySnapshot(self.policy, "test.yaml", "d", 1)
        self.pool = UpstreamPool()
        self.pool.update(self.policy)
        self.transports: dict[str, MockTransport] = {}
        for name in self.policy.deployments:
            transport = MockTransport(handlers.get(name, _fail_test))
            self.pool.get(name).transport = transport
            self.transports[name] = transport
        self.dispatcher = Dispatcher(self.pool, clock=LoopClock())
        self.dispatcher.configure(self.policy)

    def ctx(self) -> RequestContext:
        return RequestContext("req-1", "/chat/completions", self.snapshot, requested_model="fast")

    def calls(self, name: str) -> int:
        return len(self.transports[name].requests)


async def _fail_test(request: MockRequest) -> MockResponse:
    raise AssertionError(f"unexpected request to {request.endpoint}")


def answer(
    status: int = 200, obj: Any = OK, headers: dict[str, str] | None = None, delay_s: float = 0.0
) -> Handler:
    async def handler(request: MockRequest) -> MockResponse:
        response = MockResponse.json(obj, status=status, headers=headers)
        response.delay_s = delay_s
        return response

    return handler


def sequence(*handlers: Handler) -> Handler:
    """Each request gets the next handler; the last one repeats."""
    calls = 0

    async def handler(request: MockRequest) -> MockResponse:
        nonlocal calls
        current = handlers[min(calls, len(handlers) - 1)]
        calls += 1
        return await current(request)

    return handler


def cannot_connect() -> Handler:
    async def handler(request: MockRequest) -> MockResponse:
        raise aiohttp.ClientConnectionError("connection refused")

    return handler


FAST = Route("fast", ("a", "b"), "default")
ONLY_A = Route("fast", ("a",), "default")


def test_a_503_is_retried_on_the_next_deployment() -> None:
    setup = Setup({"a": answer(503), "b": answer()})
    ctx = setup.ctx()
    result = run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert b'"id":"x"' in result.body
    assert (ctx.attempts, ctx.retries, ctx.deployment) == (2, 1, "b")
    assert ctx.usage == {"prompt_tokens": 3}
    assert setup.transports["b"].requests[0].body["model"] == "b"


def test_a_client_error_is_relayed_without_a_retry() -> None:
    setup = Setup({"a": answer(400, {"error": {"message": "bad", "code": "context_length_exceeded"}})})
    with pytest.raises(UpstreamStatusError) as info:
        run(setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY))
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    assert setup.calls("b") == 0


def test_retry_honours_retry_after_on_the_same_deployment() -> None:
    setup = Setup({"a": sequence(answer(429, headers={"Retry-After": "3"}), answer())})

    async def go() -> float:
        start = asyncio.get_running_loop().time()
        await setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY)
        return asyncio.get_running_loop().time() - start

    waited_s = run(go())
    assert 3.0 <= waited_s < 3.5
    assert setup.calls("a") == 2


def test_a_retry_after_over_the_cap_is_not_waited_for() -> None:
    setup = Setup({"a": answer(429, headers={"Retry-After": "60"})}, "{retries: {retry_after_cap_s: 10}}")
    with pytest.raises(RateLimitError) as info:
        run(setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY))
    assert info.value.headers["Retry-After"] == "60"
    assert setup.calls("a") == 1


def test_retries_stop_when_the_budget_is_spent() -> None:
    setup = Setup({"a": answer(503), "b": answer()}, "{retries: {budget: {ratio: 0, min_per_s: 0}}}")
    with pytest.raises(UpstreamUnavailableError):
        run(setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY))
    assert setup.calls("b") == 0
    assert setup.dispatcher.counters["retries_refused_by_budget"] == 1


def test_retries_stop_after_max() -> None:
    setup = Setup({"a": cannot_connect(), "b": cannot_connect()}, "{retries: {max: 3}}")
    ctx = setup.ctx()
    with pytest.raises(UpstreamError) as info:
        run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert info.value.code == "upstream_disconnected"
    assert ctx.attempts == 4 and setup.calls("a") + setup.calls("b") == 4


def test_fallback_tier_answers_when_the_tier_fails() -> None:
    setup = Setup(
        {"a": answer(502), "b": answer(500), "c": answer()}, "{fallback: {fast: [strong]}, retries: {max: 2}}"
    )
    ctx = setup.ctx()
    run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert (ctx.deployment, ctx.fallback_tier) == ("c", "strong")
    assert setup.dispatcher.counters["fallbacks"] == 1


def test_a_slow_attempt_is_hedged_and_the_twin_wins() -> None:
    setup = Setup(
        {"a": answer(delay_s=30.0), "b": answer(delay_s=0.1)},
        "{hedge: {enabled: true, after_s: 0.5, budget_ratio: 1.0}}",
    )
    ctx = setup.ctx()
    run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert ctx.deployment == "b" and ctx.hedged
    assert setup.dispatcher.counters["hedges"] == 1 and setup.dispatcher.counters["hedges_won"] == 1


def test_a_fast_attempt_is_not_hedged() -> None:
    setup = Setup({"a": answer(delay_s=0.1)}, "{hedge: {enabled: true, after_s: 0.5, budget_ratio: 1.0}}")
    ctx = setup.ctx()
    run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert ctx.deployment == "a" and not ctx.hedged and setup.calls("b") == 0


def test_circuit_opens_skips_the_deployment_then_probes_and_closes() -> None:
    healthy = False

    async def flaky(request: MockRequest) -> MockResponse:
        return await answer(200 if healthy else 503)(request)

    setup = Setup(
        {"a": flaky, "b": answer()},
        "{circuit: {consecutive_failures: 2, cooldown_s: 15, shared: false}, retries: {max: 1}}",
    )
    dispatcher = setup.dispatcher

    async def go() -> None:
        nonlocal healthy
        for _ in range(2):
            await dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY)
        assert dispatcher.breakers.is_open("a") and not dispatcher.available("a")
        ctx = setup.ctx()
        await dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        assert ctx.attempts == 1 and ctx.deployment == "b"  # a is skipped while open
        await asyncio.sleep(15)
        healthy = True
        ctx = setup.ctx()
        await dispatcher.unary(ctx, FAST, "/chat/completions", BODY)  # the half-open probe
        assert ctx.deployment == "a"
        assert dispatcher.breakers.status()["a"]["state"] == "closed"

    run(go())
    assert setup.calls("a") == 3
    assert dispatcher.breakers.transitions == {("a", "open"): 1, ("a", "half_open"): 1, ("a", "closed"): 1}


def test_a_429_does_not_count_against_the_circuit() -> None:
    setup = Setup({"a": answer(429), "b": answer()}, "{circuit: {consecutive_failures: 1, shared: false}}")
    run(setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY))
    assert not setup.dispatcher.breakers.is_open("a")


def test_a_stream_without_a_first_token_in_time_is_retried() -> None:
    async def slow(request: MockRequest) -> MockResponse:
        return MockResponse.sse([{"choices": [{"delta": {"content": "late"}}]}], delay_s=20.0)

    async def fine(request: MockRequest) -> MockResponse:
        return MockResponse.sse([{"model": "b", "choices": [{"delta": {"content": "hi"}}]}])

    setup = Setup({"a": slow, "b": fine}, "{timeouts: {first_token_s: 5}}")
    ctx = setup.ctx()

    async def go() -> bytes:
        opened = await setup.dispatcher.open_stream(ctx, FAST, "/chat/completions", {**BODY, "stream": True})
        out = opened.first + b"".join([chunk async for chunk in opened.rest()])
        opened.close()
        return out

    out = run(go())
    assert out.endswith(b"data: [DONE]\n\n") and ctx.deployment == "b" and ctx.retries == 1
    sent = setup.transports["b"].requests[0].body
    assert sent["stream_options"] == {"include_usage": True}  # asked for on the client's behalf


def test_a_stream_cut_after_its_first_event_ends_with_stream_incomplete() -> None:
    async def cut(request: MockRequest) -> MockResponse:
        return MockResponse.sse([{"choices": [{"delta": {"content": "a"}}]}] * 2, done=False)

    setup = Setup({"a": cut})

    async def go() -> None:
        opened = await setup.dispatcher.open_stream(
            setup.ctx(), ONLY_A, "/chat/completions", {**BODY, "stream": True}
        )
        try:
            async for _ in opened.rest():
                pass
        finally:
            opened.close()

    with pytest.raises(Exception) as info:
        run(go())
    assert getattr(info.value, "code", None) == "stream_incomplete"
