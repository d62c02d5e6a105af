"""The shadow sampler's decisions: one draw, only classifier decisions, the per-minute and
in-flight caps, and a failed shadow call counted, never raised."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.auth.keys import KeyRecord
from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.dispatch.clock import ManualClock
from gateway.providers.pool import UpstreamPool
from gateway.routing.resolve import Route
from gateway.routing.shadow import ShadowSampler, answer_of
from gateway.store.writer import StatsWriter

POLICY = """
deployments:
  a: {base_url: "http://127.0.0.1:9/v1"}
  b: {base_url: "http://127.0.0.1:9/v1"}
tiers: {fast: [a], strong: [b]}
routing:
  classifier: {name: linear, bias: 0.0, weights: {}}
  shadow: {share: 0.5, max_per_minute: 2, max_concurrent: 2}
"""
BODY: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
SCORED = Route("fast", ("a",), "score", 0.2, 0.5)


class Draws:
    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.values.pop(0)


def sampler(draw: Draws, policy: str = POLICY) -> tuple[ShadowSampler, RequestContext, ManualClock]:
    snapshot = PolicySnapshot(parse_policy(policy, "p"), source="p", digest="", version=1)
    pool = UpstreamPool()
    pool.update(snapshot.policy)
    clock = ManualClock()
    shadow = ShadowSampler(
        pool,
        lambda name: True,
        StatsWriter(None),
        None,
        clock=clock,
        draw=draw,  # type: ignore[arg-type]
    )
    ctx = RequestContext(request_id="r1", endpoint="/v1/chat/completions", snapshot=snapshot)
    return shadow, ctx, clock


def test_a_request_that_is_not_sampled_costs_one_draw() -> None:
    draw = Draws(0.7)
    shadow, ctx, _ = sampler(draw)
    shadow.after_answer(ctx, SCORED, BODY, b"{}")
    assert draw.calls == 1 and shadow.in_flight == 0 and shadow.counters["sampled"] == 0


def test_only_classifier_decisions_are_sampled_and_only_with_shadow_on() -> None:
    draw = Draws()
    shadow, ctx, _ = sampler(draw)
    shadow.after_answer(ctx, Route("strong", ("b",), "rule:tools"), BODY, b"{}")
    shadow.after_answer(ctx, Route("fast", ("a",), "hint"), BODY, b"{}")
    off, off_ctx, _ = sampler(
        draw, POLICY.replace("  shadow: {share: 0.5, max_per_minute: 2, max_concurrent: 2}\n", "")
    )
    off.after_answer(off_ctx, SCORED, BODY, b"{}")
    assert draw.calls == 0


def test_a_key_limited_to_its_tier_is_not_shadowed_on_the_other() -> None:
    shadow, ctx, _ = sampler(Draws(0.1, 0.1))
    ctx.requested_model = "auto"
    ctx.key = KeyRecord("k1", "one-tier", models=frozenset({"fast"}))
    shadow.after_answer(ctx, SCORED, BODY, b"{}")
    assert shadow.counters["skipped_key"] == 1 and shadow.in_flight == 0
    ctx.key = KeyRecord("k2", "auto", models=frozenset({"auto"}))
    shadow._admit = lambda settings: False  # type: ignore[method-assign]  # stop before a task starts
    shadow.after_answer(ctx, SCORED, BODY, b"{}")
    assert shadow.counters["skipped_key"] == 1 and shadow.counters["sampled"] == 2


def test_caps_in_flight_and_per_minute_and_failures_are_counted() -> None:
    async def run() -> ShadowSampler:
        draw = Draws(*[0.1] * 6)
        shadow, ctx, clock = sampler(draw)

        async def settle() -> None:
            await asyncio.gather(*list(shadow._tasks))

        for _ in range(3):
            shadow.after_answer(ctx, SCORED, BODY, b"{}")
        assert shadow.counters["sampled"] == 3
        assert shadow.counters["skipped_busy"] == 1 and shadow.in_flight == 2
        await settle()
        shadow.after_answer(ctx, SCORED, BODY, b"{}")  # two calls this minute already
        assert shadow.counters["skipped_rate"] == 1 and shadow.in_flight == 0
        clock.advance(61)
        shadow.after_answer(ctx, SCORED, BODY, b"{}")
        await settle()
        await shadow.close()
        await shadow._pool.close()
        return shadow

    shadow = asyncio.run(run())
    # Nothing listens on port 9: each shadow call failed, and nothing was raised.
    assert shadow.counters["failed"] == 3 and shadow.counters["stored"] == 0


def test_answer_of_reads_content_tool_calls_and_finish_reason() -> None:
    body = b'{"choices": [{"message": {"content": "x", "tool_calls": null}, "finish_reason": "stop"}]}'
    assert answer_of(body, "a") == {
        "deployment": "a",
        "content": "x",
        "tool_calls": None,
        "finish_reason": "stop",
    }
    assert answer_of(b"{not json", "a")["content"] is None


class Pipe:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))


def test_an_escalation_is_queued_for_the_flush_and_a_pair_that_cannot_be_written_is_counted() -> None:
    policy = POLICY.replace("routing:\n", "routing:\n  escalation: {enabled: true}\n")
    shadow, ctx, _ = sampler(Draws(), policy)
    ctx.escalated, ctx.deployment = "empty", "b"
    first = b'{"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]}'
    second = b'{"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}'
    shadow.escalated(ctx, SCORED, BODY, first, "a", second)
    shadow.escalated(
        ctx, SCORED, {**BODY, "messages": [{"role": "user", "content": {1, 2}}]}, first, "a", second
    )  # a set: not JSON
    writer = shadow._writer
    pipe = Pipe()
    for op in list(writer._pending):
        op(pipe)
    assert [name for name, _ in pipe.calls] == ["lpush", "ltrim", "expire"]
    assert shadow.counters["escalations_stored"] == 1 and shadow.counters["failed"] == 1
    stored = json.loads(pipe.calls[0][1][1])
    assert stored["kind"] == "escalation" and stored["strong_passed"] is True
    assert (stored["fast"]["deployment"], stored["strong"]["deployment"]) == ("a", "b")
