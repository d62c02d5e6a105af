"""The retry budget is per deployment: retries a failing deployment used up never refuse
a fallback to a healthy one (issue #50, item 9)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import UpstreamUnavailableError
from gateway.routing.resolve import Route
from tests.unit.dispatch.test_dispatcher import BODY, Setup, answer, sequence
from tests.unit.dispatch.virtual_time import run

MAIN_ONLY = Route(None, ("a",), "model")
"""Requests naming deployment ``a`` itself: retries can only go back to it."""
MAIN_WITH_FALLBACK = Route("fast", ("a",), "default")
"""The tier ``fast`` (here only ``a``) with ``strong`` (``c``) as its fallback tier."""


def test_retries_spent_on_the_main_deployment_do_not_refuse_the_fallback() -> None:
    # Every request's first try on a fails with a 503 and its retry (on a) answers.
    flaky = sequence(*[answer(503), answer()] * 10, answer(503))
    setup = Setup(
        {"a": flaky, "c": answer()},
        "{fallback: {fast: [strong]}, circuit: {failure_rate: 0.9, shared: false}, retries: {backoff: {base_s: 0.01, max_s: 0.01}}}",
    )
    dispatcher = setup.dispatcher

    async def go() -> str:
        for _ in range(10):  # 10 retries on a within about 2 s
            ctx = setup.ctx()
            await dispatcher.unary(ctx, MAIN_ONLY, "/chat/completions", BODY)
            assert (ctx.deployment, ctx.retries) == ("a", 1)
            await asyncio.sleep(0.2)
        ctx = setup.ctx()
        await dispatcher.unary(ctx, MAIN_WITH_FALLBACK, "/chat/completions", BODY)
        assert ctx.fallback_tier == "strong" and ctx.retries == 1
        status = dispatcher.status()["retry_budget"]
        assert status["deployments"]["a"]["spent"] == 10 and status["deployments"]["c"]["spent"] == 1
        return ctx.deployment

    assert run(go()) == "c"
    assert setup.calls("c") == 1
    assert dispatcher.counters["retries_refused_by_budget"] == 0


def test_the_main_deployments_own_retries_are_still_bounded() -> None:
    # The same load with no fallback tier: the 11th retry on a is refused by a's budget
    # (at most 1 a second over 10 s by default), so an outage is not multiplied.
    setup = Setup({"a": sequence(*[answer(503), answer()] * 10, answer(503))}, "{circuit: {enabled: false}}")
    dispatcher = setup.dispatcher

    async def go() -> None:
        for _ in range(10):
            await dispatcher.unary(setup.ctx(), MAIN_ONLY, "/chat/completions", BODY)
            await asyncio.sleep(0.2)
        with pytest.raises(UpstreamUnavailableError):  # the 503 is what the client gets
            await dispatcher.unary(setup.ctx(), MAIN_ONLY, "/chat/completions", BODY)

    run(go())
    assert dispatcher.counters["retries_refused_by_budget"] == 1
    assert setup.calls("a") == 21
