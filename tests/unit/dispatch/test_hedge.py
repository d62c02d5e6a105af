"""Hedging without a task per request: the first attempt runs in the request's own task,
a twin starts only when it is slow, the first to deliver wins, and nothing is left running.
Against MockTransport, on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from gateway.dispatch.attempt import OpenStream
from gateway.providers.mock import MockRequest, MockResponse
from tests.unit.dispatch.test_dispatcher import BODY, FAST, OK, Handler, Setup, answer
from tests.unit.dispatch.virtual_time import run

HEDGE = "{hedge: {enabled: true, after_s: 0.5, budget_ratio: 1.0}, retries: {max: 0}}"
CHUNK = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {}}]}


def test_a_hedged_request_that_is_not_slow_runs_in_the_requests_own_task() -> None:
    seen: list[asyncio.Task[object] | None] = []

    async def handler(request: MockRequest) -> MockResponse:
        seen.append(asyncio.current_task())
        return MockResponse.json(OK)

    setup = Setup({"a": handler}, HEDGE)

    async def go() -> asyncio.Task[object] | None:
        await setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY)
        return asyncio.current_task()

    request_task = run(go())
    assert seen == [request_task]
    assert setup.dispatcher.counters["hedges"] == 0


def test_the_twin_answers_when_the_first_attempt_fails_while_it_runs() -> None:
    # a fails at 1.0 s (no retries allowed); the twin, started at 0.5 s, answers at 1.5 s.
    setup = Setup({"a": answer(500, delay_s=1.0), "b": answer(delay_s=1.0)}, HEDGE)
    ctx = setup.ctx()

    async def go() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        return loop.time() - start

    assert run(go()) == pytest.approx(1.5)
    assert ctx.deployment == "b" and ctx.hedged
    assert setup.dispatcher.counters["hedges_won"] == 1


def test_the_first_attempt_wins_over_a_slower_twin_and_the_twin_is_cancelled() -> None:
    # a answers at 0.8 s; the twin (started at 0.5 s) would answer at 5.5 s.
    setup = Setup({"a": answer(delay_s=0.8), "b": answer(delay_s=5.0)}, HEDGE)
    ctx = setup.ctx()

    async def go() -> int:
        await setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        return len(asyncio.all_tasks())

    assert run(go()) == 1, "the twin's task is gone when the request returns"
    assert ctx.deployment == "a" and ctx.hedged
    assert setup.dispatcher.counters["hedges_won"] == 0


def test_a_cancelled_hedged_request_cancels_its_twin() -> None:
    setup = Setup({"a": answer(delay_s=30.0), "b": answer(delay_s=30.0)}, HEDGE)

    async def go() -> int:
        request = asyncio.ensure_future(setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY))
        await asyncio.sleep(1.0)  # the twin runs by now
        assert setup.calls("b") == 1
        request.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await request
        return len(asyncio.all_tasks())

    assert run(go()) == 1


def test_a_stream_opened_by_the_twin_is_read_with_its_idle_bound() -> None:
    slow: Handler = lambda request: _sse(delay_s=30.0)  # noqa: E731
    quick: Handler = lambda request: _sse(delay_s=0.1)  # noqa: E731
    setup = Setup({"a": slow, "b": quick}, HEDGE)
    ctx = setup.ctx()

    async def go() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        opened = await setup.dispatcher.open_stream(ctx, FAST, "/chat/completions", dict(BODY, stream=True))
        assert isinstance(opened, OpenStream)
        try:
            parts = [opened.first] + [chunk async for chunk in opened.rest()]
        finally:
            opened.close()
        return sum(part.count(b"data: ") for part in parts), loop.time() - start

    events, took_s = run(go())
    assert events == 4 and took_s == pytest.approx(0.5 + 0.4)
    assert ctx.deployment == "b"


async def _sse(delay_s: float) -> MockResponse:
    return MockResponse.sse([CHUNK, CHUNK, CHUNK], delay_s=delay_s)
