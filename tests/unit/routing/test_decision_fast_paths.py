"""The routing decision's fast paths decide what the plain ones did: rules compiled once
per policy match as the condition-by-condition reading, the router reads the text
features only when a rule or the classifier needs them and still chooses what the full
decision chooses, and the n-gram words are folded as bytes with str.translate's result."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.config import parse_policy
from gateway.routing.classifiers.ngram import Ngram, words
from gateway.routing.features import RULE_FEATURES, STRUCTURE_FEATURES, extract, structure
from gateway.routing.resolve import Router
from gateway.routing.rules import Rule


# The reading before issue #20 round 5, kept here as the reference.
def _reference_matches(rule: Rule, values: Mapping[str, Any]) -> bool:
    for key, condition in rule.when.items():
        value = values.get(key)
        if isinstance(condition, dict):
            for op, target in condition.items():
                if op == "in":
                    if value not in target:
                        return False
                elif op == "eq":
                    if value != target:
                        return False
                elif op == "ne":
                    if value == target:
                        return False
                elif value is None or not _reference_compare(op, value, target):
                    return False
        elif value != condition:
            return False
    return True


def _reference_compare(op: str, value: Any, target: Any) -> bool:
    try:
        return bool(
            {"gt": value > target, "gte": value >= target, "lt": value < target}.get(op, value <= target)
        )
    except TypeError:
        return False


_FOLD = str.maketrans("0123456789" + string.punctuation, "0" * 10 + " " * len(string.punctuation))

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 20_000),
    st.floats(0, 1),
    st.sampled_from(["fast", "strong", "x"]),
)
_OPS = st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte"])
_CONDITION = st.one_of(
    _VALUES,
    st.dictionaries(_OPS, _VALUES, min_size=1, max_size=3),
    st.builds(lambda vs: {"in": vs}, st.lists(_VALUES, max_size=3)),
)
_WHEN = st.dictionaries(st.sampled_from(RULE_FEATURES), _CONDITION, min_size=1, max_size=4)


@settings(max_examples=500, deadline=None)
@given(_WHEN, st.fixed_dictionaries({name: _VALUES for name in RULE_FEATURES}))
def test_compiled_rules_match_as_the_plain_reading(when: dict[str, Any], values: dict[str, Any]) -> None:
    rule = Rule(when=when, tier="strong")

    class Attrs:
        pass

    holder = Attrs()
    for name, value in values.items():
        setattr(holder, name, value)
    expected = _reference_matches(rule, values)
    assert rule.matches(values) is expected
    assert rule.compiled().matches(holder) is expected


def test_a_rule_on_the_body_shape_alone_is_structural() -> None:
    assert Rule(when={"model": "a", "has_tools": True}, tier="t").compiled().structural
    assert not Rule(when={"model": "a", "code_density": {"gt": 0.1}}, tier="t").compiled().structural
    assert {"model", "hint", "prompt_tokens", "has_tools"} <= STRUCTURE_FEATURES
    assert not {"code_density", "math_density", "reasoning_cues", "questions"} & STRUCTURE_FEATURES


_POLICY = """
deployments:
  a: {base_url: "http://127.0.0.1:1/v1"}
  b: {base_url: "http://127.0.0.1:1/v1"}
tiers: {fast: [a], strong: [b]}
routing:
  route_all: true
  honor_hint: true
  rules:
    - {when: {model: b}, tier: strong}
    - {when: {reasoning_cues: {gte: 2}}, tier: strong}
    - {when: {has_tools: true, questions: {gt: 1}}, tier: fast}
    - {when: {prompt_tokens: {gt: 40}}, tier: fast}
  classifier: {name: ngram}
  threshold: 0.5
"""
_ROUTER = Router(parse_policy(_POLICY, "test"))
_TEXT = st.lists(
    st.sampled_from(["why", " prove it", "step by step", "?", "\n1. a", "def f():", "x" * 50, "中文", " "]),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["auto", "b", "a"]),
    _TEXT,
    st.booleans(),
    st.sampled_from([None, "fast", "strong", "nope"]),
)
@example("b", "why why", False, None)
def test_the_router_without_the_text_features_chooses_what_the_full_decision_does(
    model: str, text: str, tools: bool, hint: str | None
) -> None:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    decision = _ROUTER.decide(body, hint)
    route = _ROUTER.resolve(body, hint)
    assert route.tier == decision.tier
    assert route.score == decision.score
    assert route.reason == ("score" if decision.score is not None else decision.reason)
    assert decision.features == extract(body, hint)
    assert structure(body, hint).last_user == text


def test_a_classifier_that_reads_the_text_features_gets_them() -> None:
    shipped = _ROUTER.classifier
    assert isinstance(shipped, Ngram) and not shipped.reads_text_features
    model = replace(shipped.model, shape={"code_density": 2.0, "reasoning_cues": 1.5})
    router = Router(parse_policy(_POLICY, "test"))
    router.classifier = Ngram(model)
    assert router.classifier.reads_text_features
    body = {"model": "auto", "messages": [{"role": "user", "content": "```py\nx = 1\n``` why"}]}
    assert router.resolve(body).score == router.decide(body).score
    assert router.decide(body).score != _ROUTER.decide(body).score


@settings(max_examples=500, deadline=None)
@given(
    st.text(max_size=80) | st.lists(st.sampled_from(["a", "B1", " ", ".", "é"]), max_size=400).map("".join)
)
@example("\ud83d\ude00 A-10432; x\ud800y: 3.5%")
@example("İstanbul'DA 12,5 €")
def test_words_fold_as_str_translate_does(text: str) -> None:
    tokens = text.lower().translate(_FOLD).split()
    if len(tokens) > 160:
        tokens = tokens[:80] + tokens[-80:]
    assert words(text) == tokens
