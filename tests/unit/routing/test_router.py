"""Rules, classifiers, thresholds, hints and deployment choice."""

from __future__ import annotations

import math
from collections import Counter
from typing import Literal

import pytest

from gateway.config import PolicyError, parse_policy
from gateway.errors import ModelNotFoundError
from gateway.routing.classifiers import CLASSIFIERS, Classifier, ClassifierSettings, register
from gateway.routing.classifiers.linear import Linear, LinearSettings
from gateway.routing.features import Features, extract
from gateway.routing.resolve import Router, order_tier

BASE = """
deployments:
  f1: {base_url: "http://x/v1"}
  f2: {base_url: "http://x/v1"}
  s1: {base_url: "http://x/v1"}
tiers:
  fast: [f1, {deployment: f2, weight: 3}]
  strong: [s1]
"""


def router(routing: str) -> Router:
    return Router(parse_policy(BASE + routing, "p.yaml"))


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}


CLASSIFIER = """
routing:
  classifier: {name: linear, bias: -2.0, weights: {reasoning_cues: 10.0}}
  threshold: 0.5
"""


def test_no_classifier_uses_the_default_tier() -> None:
    route = router("routing: {default_tier: strong}").resolve(chat("hi"))
    assert (route.tier, route.header()) == ("strong", "tier=strong; by=default")


def test_linear_score_against_the_threshold() -> None:
    r = router(CLASSIFIER)
    easy = r.resolve(chat("hello"))
    assert easy.tier == "fast" and easy.header() == "tier=fast; score=0.12; threshold=0.5"
    hard = r.resolve(chat("prove and derive it"))
    assert hard.tier == "strong" and hard.score == pytest.approx(1 / (1 + math.exp(-(-2.0 + 10.0 * 2 / 5))))


def test_score_equal_to_the_threshold_goes_strong() -> None:
    r = router("routing:\n  classifier: {name: linear, bias: 0.0, weights: {}}\n  threshold: 0.5\n")
    assert r.resolve(chat("anything")).tier == "strong"


def test_rules_first_match_wins_and_beat_the_classifier() -> None:
    r = router(
        CLASSIFIER
        + """
  rules:
    - {when: {has_tools: true}, tier: strong}
    - {name: short, when: {prompt_tokens: {lt: 100}}, tier: fast}
    - {when: {prompt_tokens: {lt: 100}}, tier: strong}
"""
    )
    tools = r.resolve(chat("prove it", tools=[{"type": "function", "function": {"name": "t"}}]))
    assert tools.header() == "tier=strong; by=rule:has_tools"
    short = r.resolve(chat("prove and derive and explain"))
    assert short.header() == "tier=fast; by=rule:short"


def test_comparisons() -> None:
    r = router("""
routing:
  default_tier: fast
  rules:
    - {name: long, when: {prompt_tokens: {gte: 10, lte: 20}}, tier: strong}
    - {name: named, when: {model: {in: [gpt-4.1]}}, tier: strong}
    - {name: notjson, when: {json_mode: {ne: false}}, tier: strong}
  route_all: true
""")
    assert r.resolve(chat("x" * 40)).header() == "tier=strong; by=rule:long"
    assert r.resolve(chat("x" * 100)).tier == "fast"
    assert r.resolve({**chat("x"), "model": "gpt-4.1"}).header() == "tier=strong; by=rule:named"
    assert (
        r.resolve(chat("x", response_format={"type": "json_object"})).header()
        == "tier=strong; by=rule:notjson"
    )


def test_hint_beats_rules_unless_disabled() -> None:
    rules = "\n  rules: [{when: {has_tools: false}, tier: fast}]\n"
    assert router("routing:" + rules).resolve(chat("x"), hint="strong").header() == "tier=strong; by=hint"
    assert router("routing:\n  honor_hint: false" + rules).resolve(chat("x"), hint="strong").tier == "fast"
    assert router("routing:" + rules).resolve(chat("x"), hint="bogus").tier == "fast"


def test_names_bypass_or_choose_the_tier() -> None:
    r = router(CLASSIFIER)
    assert r.resolve({**chat("prove"), "model": "f2"}).header() == "deployment=f2; by=model"
    assert r.resolve({**chat("prove"), "model": "fast"}).header() == "tier=fast; by=model"
    with pytest.raises(ModelNotFoundError):
        r.resolve({**chat("x"), "model": "nope"})


def test_route_all_routes_every_name() -> None:
    assert (
        router("routing: {route_all: true, default_tier: strong}").resolve({**chat("x"), "model": "f1"}).tier
        == "strong"
    )


def test_preference_order_with_an_open_circuit_last() -> None:
    policy = parse_policy(BASE, "p")
    assert order_tier(policy, "fast") == ("f1", "f2")
    assert order_tier(policy, "fast", available=lambda n: n != "f1") == ("f2", "f1")


def test_least_outstanding() -> None:
    policy = parse_policy(BASE + "routing: {choice_by_tier: {fast: least_outstanding}}\n", "p")
    assert order_tier(policy, "fast", in_flight={"f1": 3, "f2": 1}) == ("f2", "f1")
    assert order_tier(policy, "fast", in_flight={"f1": 1, "f2": 1}) == ("f1", "f2")


def test_weighted_choice_follows_the_weights() -> None:
    policy = parse_policy(BASE + "routing: {choice: weighted}\n", "p")
    firsts = Counter(order_tier(policy, "fast")[0] for _ in range(4000))
    assert 0.70 < firsts["f2"] / 4000 < 0.80  # weight 3 of 4
    never_open = Counter(order_tier(policy, "fast", available=lambda n: n != "f2")[0] for _ in range(200))
    assert never_open == {"f1": 200}


def test_new_classifiers_drop_in_by_name() -> None:
    class AlwaysSettings(ClassifierSettings):
        name: Literal["always"] = "always"
        bias: float

    @register(AlwaysSettings)
    class Always(Classifier):
        def __init__(self, settings: AlwaysSettings) -> None:
            self.value = settings.bias

        def strong_probability(self, features: Features) -> float:
            return self.value

    try:
        r = router("routing:\n  classifier: {name: always, bias: 0.9}\n")
        assert r.resolve(chat("hi")).header() == "tier=strong; score=0.90; threshold=0.5"
        with pytest.raises(PolicyError) as missing:
            router("routing:\n  classifier: {name: always, weights: {}}\n")
        assert sorted(i.path for i in missing.value.issues) == [
            "routing.classifier.bias",
            "routing.classifier.weights",
        ]
    finally:
        del CLASSIFIERS["always"]
    with pytest.raises(PolicyError) as info:
        router("routing:\n  classifier: {name: always}\n")
    assert info.value.issues[0].path == "routing.classifier.name"


def test_linear_contributions_sum_to_the_logit() -> None:
    clf = Linear(LinearSettings(weights={"reasoning_cues": 2.0, "questions": -1.0}, bias=-0.5))
    f = extract(chat("Why? How?"))
    z = -0.5 + sum(clf.contributions(f).values())
    assert clf.strong_probability(f) == pytest.approx(1 / (1 + math.exp(-z)))
    assert clf.explain(f)[0] == ("bias", -0.5)
    assert [label for label, _ in clf.explain(f)[1:]] == ["reasoning_cues", "questions"]


@pytest.mark.parametrize(
    ("block", "path", "text"),
    [
        (
            "routing:\n  rules: [{when: {vibes: 3}, tier: strong}]",
            "routing.rules[0].when",
            "unknown feature 'vibes'",
        ),
        ("routing:\n  classifier: {weights: {vibes: 1.0}}", "routing.classifier.weights", "unknown feature"),
        ("routing:\n  threshold: 1.5", "routing.threshold", "less than or equal to 1"),
        (
            "routing:\n  rules: [{when: {has_tools: true}, tier: medium}]",
            "routing.rules[0].tier",
            "unknown tier 'medium'",
        ),
        (
            "routing:\n  rules: [{when: {prompt_tokens: {above: 3}}, tier: strong}]",
            "routing.rules[0].when",
            "comparisons",
        ),
    ],
)
def test_malformed_routing_blocks_are_rejected_with_their_path(block: str, path: str, text: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(BASE + block + "\n", "p.yaml")
    issue = info.value.issues[0]
    assert issue.path == path and text in issue.message and issue.line is not None
