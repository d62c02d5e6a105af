"""The one request pipeline, with a stand-in dispatcher: escalation, the prefix expectation,
and what the pipeline hands its sinks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson

from gateway.api.protocol import ChatCompletionRequest, CompletionRequest
from gateway.config import PolicySnapshot, Settings, parse_policy
from gateway.context import RequestContext
from gateway.dispatch.attempt import UnaryResult
from gateway.pipeline import Stages, finish, run_unary
from gateway.routing.resolve import Route
from gateway.shaping.service import ShapingState
from gateway.store.writer import StatsWriter
from gateway.telemetry.record import FinishedRequest

POLICY = parse_policy(
    """
deployments:
  d-fast: {base_url: "http://x"}
  d-strong: {base_url: "http://x"}
tiers: {fast: [d-fast], strong: [d-strong]}
routing:
  escalation: {enabled: true}
""",
    "p",
)
SNAPSHOT = PolicySnapshot(policy=POLICY, source="p", digest="d", version=1)
EMPTY = orjson.dumps({"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]})
ANSWER = orjson.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})


class _Dispatcher:
    """Answers with the given bodies in turn; remembers the tiers it was sent to."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = list(answers)
        self.tiers: list[str | None] = []
        self.pool = SimpleNamespace(in_flight={})

    def available(self, name: str) -> bool:
        return True

    async def unary(
        self, ctx: RequestContext, route: Route, endpoint: str, body: Any, adapt: Any = None
    ) -> UnaryResult:
        self.tiers.append(route.tier)
        ctx.deployment = route.deployments[0]
        return UnaryResult(self.answers.pop(0), "application/json")


def _stages(dispatcher: _Dispatcher, sinks: tuple[Any, ...] = ()) -> Stages:
    return Stages(
        settings=Settings(),
        shaping=ShapingState(),
        dispatcher=dispatcher,  # type: ignore[arg-type]
        limiter=None,  # type: ignore[arg-type]  # no key: nothing is admitted or charged
        stats=StatsWriter(None),  # type: ignore[arg-type]  # sums in process only
        sinks=sinks,
    )


def _ctx() -> RequestContext:
    return RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=SNAPSHOT)


def _chat(model: str = "fast") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Be brief and kind. " * 600},
            {"role": "user", "content": "hi"},
        ],
    }


def test_a_fast_answer_that_fails_a_check_is_asked_again_of_the_escalation_tier() -> None:
    dispatcher, ctx = _Dispatcher(EMPTY, ANSWER), _ctx()
    result = asyncio.run(
        run_unary(_stages(dispatcher), ctx, ChatCompletionRequest, "/chat/completions", _chat(), {})
    )
    assert result.body == ANSWER and dispatcher.tiers == ["fast", "strong"]
    assert ctx.escalated == "empty" and ctx.tier == "strong" and ctx.deployment == "d-strong"
    assert ctx.route_reason is not None and "escalation:empty" in ctx.route_reason


def test_only_chat_answers_are_checked_for_escalation() -> None:
    dispatcher, ctx = _Dispatcher(EMPTY), _ctx()
    body = {"model": "fast", "prompt": "hi"}
    result = asyncio.run(run_unary(_stages(dispatcher), ctx, CompletionRequest, "/completions", body, {}))
    assert result.body == EMPTY and dispatcher.tiers == ["fast"] and ctx.escalated is None


def test_the_prefix_expectation_is_set_for_the_deployment_that_answered() -> None:
    stages = _stages(_Dispatcher(ANSWER, ANSWER))
    first, second = _ctx(), _ctx()
    for ctx in (first, second):
        asyncio.run(run_unary(stages, ctx, ChatCompletionRequest, "/chat/completions", _chat(), {}))
    assert first.prefix_chain is not None and first.prefix_hit_tokens == 0
    # The same prompt again, on the same deployment: this replica expects its prefix cached.
    assert second.prefix_hit_tokens is not None and second.prefix_hit_tokens > 0


def test_finish_hands_one_record_to_every_sink() -> None:
    seen: list[list[FinishedRequest]] = [[], []]
    stages = _stages(_Dispatcher(ANSWER), sinks=(seen[0].append, seen[1].append))
    ctx = _ctx()
    ctx.status = 200
    asyncio.run(run_unary(stages, ctx, ChatCompletionRequest, "/chat/completions", _chat(), {}))
    finish(stages, ctx)
    assert len(seen[0]) == 1 and seen[0] == seen[1] and seen[0][0] is seen[1][0]
    assert seen[0][0].deployment == "d-fast" and ctx.finished_at is not None


class _Dialect:
    """Another endpoint's dialect: counts the chat views the router asked for."""

    def __init__(self) -> None:
        self.views = 0

    def routing_view(self, body: Any) -> dict[str, Any]:
        self.views += 1
        return {"model": body["model"], "messages": body["messages"]}

    def adapt(self, inner: Any) -> Any:
        return inner


def test_another_dialects_chat_view_is_made_only_when_the_router_reads_the_body() -> None:
    routed = PolicySnapshot(
        policy=parse_policy(
            "deployments: {d-fast: {base_url: 'http://x'}, d-strong: {base_url: 'http://x'}}\n"
            "tiers: {fast: [d-fast], strong: [d-strong]}\nrouting: {classifier: {bias: 2.0}}\n",
            "p",
        ),
        source="p",
        digest="d",
        version=1,
    )
    for model, views, tier in (("d-fast", 0, None), ("fast", 0, "fast"), ("auto", 1, "strong")):
        dialect, ctx = _Dialect(), RequestContext(request_id="r", endpoint="/v1/responses", snapshot=routed)
        stages = _stages(_Dispatcher(ANSWER))
        asyncio.run(run_unary(stages, ctx, ChatCompletionRequest, "/responses", _chat(model), {}, dialect))
        assert (dialect.views, ctx.tier) == (views, tier), model
