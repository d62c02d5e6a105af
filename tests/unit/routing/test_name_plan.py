"""A model name's routing plan (made once per policy) routes as the full decision does: rules
on ``model`` settled by the name, the rules before a settled one still tried first, a tier
hint still honoured, and only what the body can change left for each request."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.config import parse_policy
from gateway.errors import ModelNotFoundError
from gateway.routing import resolve
from gateway.routing.resolve import Route, Router, order_tier

_DEPLOYMENTS = """
deployments:
  a: {base_url: "http://127.0.0.1:1/v1"}
  b: {base_url: "http://127.0.0.1:1/v1"}
  c: {base_url: "http://127.0.0.1:1/v1"}
tiers: {fast: [a], strong: [b], wide: [a, c]}
aliases: {cheap: a, big: strong}
"""

_RULES = [
    "{when: {model: b}, tier: strong}",
    "{when: {model: {in: [a, b]}}, tier: wide}",
    "{when: {model: {ne: auto}, has_tools: true}, tier: strong}",
    "{when: {reasoning_cues: {gte: 2}}, tier: strong}",
    "{when: {has_tools: true}, tier: wide}",
    "{when: {model: auto}, tier: fast}",
    "{when: {prompt_tokens: {gt: 3}, model: c}, tier: wide}",
]


def _policy(rules: list[str], route_all: bool, honor_hint: bool, classifier: bool) -> str:
    lines = [f"  route_all: {str(route_all).lower()}", f"  honor_hint: {str(honor_hint).lower()}"]
    if rules:
        lines.append("  rules: [" + ", ".join(rules) + "]")
    if classifier:
        lines.append("  classifier: {name: ngram}")
    return _DEPLOYMENTS + "routing:\n" + "\n".join(lines) + "\n"


def _reference(router: Router, body: dict[str, Any], hint: str | None) -> Route:
    """The route as the router chose it before names had plans: every rule, in order."""
    policy = router.policy
    model = str(body.get("model", ""))
    if not policy.routing.route_all and model != "auto":
        name = policy.aliases.get(model, model)
        if name in policy.deployments:
            return Route(tier=None, deployments=(name,), reason="model")
        if name not in policy.tiers:
            raise ModelNotFoundError(model)
        return Route(name, order_tier(policy, name), "model")
    decision = router.decide(body, hint)
    deployments = order_tier(policy, decision.tier)
    if decision.score is not None:
        return Route(decision.tier, deployments, "score", decision.score, policy.routing.threshold)
    return Route(decision.tier, deployments, decision.reason)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_RULES), max_size=4),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["auto", "a", "b", "c", "cheap", "big", "wide", "other"]),
    st.sampled_from(["hi", "why? prove it step by step", "x" * 40]),
    st.booleans(),
    st.sampled_from([None, "fast", "strong", "nope"]),
    st.sampled_from([None, "strong", "wide"]),
)
@example(["{when: {has_tools: true}, tier: wide}", "{when: {model: b}, tier: strong}"],
         True, True, False, "b", "hi", True, None, None)  # fmt: skip
def test_a_planned_route_is_the_full_decisions_route(
    rules: list[str],
    route_all: bool,
    honor_hint: bool,
    classifier: bool,
    model: str,
    text: str,
    tools: bool,
    hint: str | None,
    metadata_hint: str | None,
) -> None:
    router = Router(parse_policy(_policy(rules, route_all, honor_hint, classifier), "p"))
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    if metadata_hint is not None:
        body["metadata"] = {"switchyard_tier": metadata_hint}
    try:
        expected = _reference(router, body, hint)
    except ModelNotFoundError:
        with pytest.raises(ModelNotFoundError):
            router.resolve(body, hint)
        return
    for _ in range(2):  # the plan's first use and a later one
        route = router.resolve(body, hint)
        assert route == expected
        assert route.header() == expected.header()


def test_a_rule_on_the_name_alone_settles_the_route_once() -> None:
    router = Router(parse_policy(_policy([_RULES[0]], True, True, True), "p"))
    plan = router.plan("b")
    assert plan.route is not None and plan.route.header() == "tier=strong; by=rule:model"
    assert router.plan("b") is plan
    # Another name skips the rule and leaves the classifier to score each body.
    assert router.plan("a").route is None and router.plan("a").rules == ()


def test_rules_before_a_settled_one_are_still_tried_first() -> None:
    rules = ["{when: {has_tools: true}, tier: wide}", "{when: {model: b}, tier: strong}"]
    router = Router(parse_policy(_policy(rules, True, True, False), "p"))
    with_tools = {"model": "b", "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert router.resolve(with_tools).tier == "wide"
    assert router.resolve({"model": "b", "messages": []}).tier == "strong"


def test_a_hint_still_beats_a_settled_route() -> None:
    router = Router(parse_policy(_policy([_RULES[0]], True, True, False), "p"))
    body = {"model": "b", "messages": [], "metadata": {"switchyard_tier": "fast"}}
    assert router.resolve(body).header() == "tier=fast; by=hint"
    assert router.resolve({"model": "b", "messages": []}, "wide").tier == "wide"


def test_unknown_names_are_not_kept_and_the_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router(parse_policy(_policy([], False, True, False), "p"))
    with pytest.raises(ModelNotFoundError):
        router.plan("nope")
    assert "nope" not in router._plans
    monkeypatch.setattr(resolve, "_PLANS_KEPT", 8)
    routed = Router(parse_policy(_policy([], True, True, True), "p"))
    for i in range(20):
        routed.plan(f"name-{i}")
        assert len(routed._plans) <= 8


def test_only_a_name_the_body_can_route_needs_the_body() -> None:
    router = Router(parse_policy(_policy([_RULES[0], _RULES[3]], True, True, True), "p"))
    assert not router.reads_body("b")  # the first rule settles it
    assert router.reads_body("a") and router.reads_body("auto")
    plain = Router(parse_policy(_policy([], False, True, True), "p"))
    assert not plain.reads_body("cheap") and not plain.reads_body("wide") and plain.reads_body("auto")
    with pytest.raises(ModelNotFoundError):
        plain.reads_body("nope")
