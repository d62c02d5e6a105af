"""Text between two identical delimiter lines is one structure: it moves whole or not at all."""

from __future__ import annotations

import copy
from typing import Any

from gateway.shaping.check import semantic_changes
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.units import DELIMITED, segment

RULE = "-" * 20


def retrieved(n: int) -> str:
    # Retrieved text: list items, blank lines, a dated record, and a long line that differs
    # from one request to the next (the longest line of the prompt).
    return "\n".join(
        [
            f"source: handbook/page-{n}.md",
            "",
            f"- Orders ship within {n + 2} days of payment.",
            "- Returns need the original receipt.",
            "",
            "",
            f"Updated on 2026-11-{n + 10:02d} by the support team.",
            f"The warehouse in region {n} handles every parcel heavier than {n * 7} kilograms and "
            f"every parcel sent to an island, and it answers within {n + 1} working days.",
        ]
    )


def system(n: int) -> str:
    return "\n".join(
        [
            "You answer questions about Acme's shop.",
            "Context information is below.",
            RULE,
            retrieved(n),
            RULE,
            "Given the context information and not prior knowledge, answer the query.",
            "Answer in the user's language.",
        ]
    )


def body(n: int) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system(n)}, {"role": "user", "content": f"question {n}"}],
    }


def block(n: int) -> str:
    return "\n".join(["Context information is below.", RULE, retrieved(n), RULE])


def test_the_announced_block_between_two_rules_is_one_unit_blank_lines_included() -> None:
    lines = system(1).split("\n")
    units = segment(lines)
    delimited = [u for u in units if u.kind == DELIMITED]
    assert len(delimited) == 1
    assert "\n".join(lines[delimited[0].start : delimited[0].end]) == block(1)


def test_a_rule_of_hashes_or_equals_delimits_too_and_a_lone_rule_does_not() -> None:
    for rule in ("###", "=====", "***"):
        lines = ["Intro.", rule, "a", "", "b", rule, "Outro."]
        assert [(u.start, u.end, u.kind) for u in segment(lines) if u.kind == DELIMITED] == [
            (1, 6, DELIMITED)
        ]
    assert not [u for u in segment(["Intro.", "-----", "a", "Outro."]) if u.kind == DELIMITED]


def test_a_date_inside_a_delimited_block_never_tears_it_and_the_template_is_known() -> None:
    for placement in ("end_of_system", "after_last_turn"):
        shaper = PolicyShaper(ShapingPolicy.model_validate({"placement": placement}))
        templates = set()
        for n in range(6):
            original = body(n)
            shaped = copy.deepcopy(original)
            result = shaper.shape(shaped)
            templates.add(result.template)
            assert semantic_changes(original, shaped) == []
            head = shaped["messages"][0]["content"]
            assert block(n) in head  # whole, its blank lines included
        # The retrieved text (its longest line varies) does not name the template.
        assert len(templates) == 1, templates


def test_with_rag_enabled_the_announced_block_moves_whole_after_the_instructions() -> None:
    shaper = PolicyShaper(ShapingPolicy.model_validate({"rag": {"enabled": True}}))
    for n in range(3):
        original = body(n)
        shaped = copy.deepcopy(original)
        result = shaper.shape(shaped)
        assert shaped["messages"][0]["content"] == "\n".join(
            [
                "You answer questions about Acme's shop.",
                "Given the context information and not prior knowledge, answer the query.",
                "Answer in the user's language.",
                block(n),
            ]
        )
        assert result.rag_moved
        assert semantic_changes(original, shaped) == []
