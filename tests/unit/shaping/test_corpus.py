"""The semantic check over the template corpus: shaping never changes what a prompt means."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.shaping.check import semantic_changes
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from tests.fixtures.templates.corpus import TEMPLATES, Template, sessions

POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "end_of_system": {"placement": "end_of_system"},
    "rag": {"rag": {"enabled": True}},
    "rag_end": {"rag": {"enabled": True}, "placement": "end_of_system"},
}


def _shape_all(
    template: Template, policy: dict[str, Any]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any], Any]], PolicyShaper, StabilityModel]:
    shaper = PolicyShaper(ShapingPolicy.model_validate({"learn_min_requests": 4, **policy}))
    model = StabilityModel()
    out = []
    for turn in range(4):  # interleaved, as concurrent users arrive
        for bodies in sessions(template, users=6):
            original = bodies[turn]
            shaped = copy.deepcopy(original)
            result = shaper.shape(shaped, model)
            again = copy.deepcopy(shaped)
            shaper.shape(again, model)
            assert again == shaped, "shaping a shaped request changes nothing"
            out.append((original, shaped, result))
    return out, shaper, model


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_no_shaped_body_of_the_corpus_changes_meaning(template: Template, policy: str) -> None:
    for original, shaped, _ in _shape_all(template, POLICIES[policy])[0]:
        assert semantic_changes(original, shaped) == []


def test_the_corpus_has_at_least_ten_templates_of_each_kind_of_app() -> None:
    assert len(TEMPLATES) >= 10
    assert {t.kind for t in TEMPLATES} == {"chat", "agent", "rag"}


def test_one_template_per_app_not_per_request() -> None:
    for template in TEMPLATES:
        names = {result.template for _, _, result in _shape_all(template, POLICIES["rag"])[0]}
        assert len(names) == 1, template.name
