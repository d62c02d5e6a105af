"""The system prompt's self-contained units, and shaping that moves them whole or not at all."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.shaping.check import semantic_changes, structures
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from gateway.shaping.units import segment, unit_text


def _shape_twice(shaper: PolicyShaper, original: dict[str, Any]) -> dict[str, Any]:
    """Shape a copy of ``original``: no semantic change, and shaping it again changes nothing."""
    body = copy.deepcopy(original)
    shaper.shape(body)
    assert semantic_changes(original, body) == []
    once = copy.deepcopy(body)
    shaper.shape(body)
    assert body == once
    return body


def units_of(text: str) -> list[str]:
    lines = text.split("\n")
    return [unit_text(lines, u) for u in segment(lines)]


def shaped(system: str, *turns: tuple[str, str], **policy: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    messages = [{"role": "system", "content": system}] + [{"role": r, "content": c} for r, c in turns]
    original = {"model": "fast", "messages": messages}
    body = copy.deepcopy(original)
    PolicyShaper(ShapingPolicy.model_validate(policy)).shape(body)
    return original, body


def test_units_cover_the_text_in_order() -> None:
    text = "A.\n\n# H\nx\n```\n# not a heading\n```\n\n## Sub\ny\n====\n<m>\nz\n</m>\nB:\n- 1\n  more\n- 2\n"
    assert "\n".join(units_of(text)) == text


def test_a_list_stays_together_with_its_lead_in() -> None:
    text = "You are helpful.\nSystem info:\n- OS: Linux\n- Shell: zsh\n- Date: 2026-12-03\nBe brief."
    assert units_of(text) == [
        "You are helpful.",
        "System info:\n- OS: Linux\n- Shell: zsh\n- Date: 2026-12-03",
        "Be brief.",
    ]


def test_a_section_holds_its_subsections_up_to_a_heading_of_its_level_or_a_divider() -> None:
    text = "# Tools\n## read\nRead a file.\n## write\nWrite one.\n# Rules\nBe safe.\n====\nEnd."
    assert units_of(text) == [
        "# Tools\n## read\nRead a file.\n## write\nWrite one.",
        "# Rules\nBe safe.",
        "====",
        "End.",
    ]


def test_elements_and_fences_are_whole_and_an_inline_tag_is_not_an_element() -> None:
    text = (
        "Answer from the passages inside <context></context> XML tags.\n"
        "<memories>\n- likes tea\n\n- lives in Porto\n</memories>\n"
        "```bash\nls\n\n# list files\n```\n<b>bold</b> is fine."
    )
    assert units_of(text) == [
        "Answer from the passages inside <context></context> XML tags.",
        "<memories>\n- likes tea\n\n- lives in Porto\n</memories>",
        "```bash\nls\n\n# list files\n```",
        "<b>bold</b> is fine.",
    ]


def test_hard_wrapped_sentences_and_key_value_records_stay_together() -> None:
    text = "Answer the question using\nonly the documents.\nName: Ana\nPlan: gold\nBe brief."
    assert units_of(text) == [
        "Answer the question using\nonly the documents.",
        "Name: Ana\nPlan: gold",
        "Be brief.",
    ]


def test_numbered_rules_written_as_sentences_are_one_unit_each() -> None:
    text = (
        "Rule 1: answer precisely, citing the policy.\nRule 2: never promise refunds.\nOS: linux\nShell: zsh"
    )
    assert units_of(text) == [
        "Rule 1: answer precisely, citing the policy.",
        "Rule 2: never promise refunds.",
        "OS: linux\nShell: zsh",
    ]


def test_a_dated_list_item_moves_with_its_whole_list_never_alone() -> None:
    system = (
        "You are a coding assistant.\nFollow the user's style.\n"
        "Environment:\n- cwd: /home/ana/app\n- platform: linux\n- date: 2026-12-03\n"
        "Use tools to read files before editing them."
    )
    original, body = shaped(system, ("user", "hi"), placement="end_of_system")
    content = body["messages"][0]["content"]
    assert content.endswith("Environment:\n- cwd: /home/ana/app\n- platform: linux\n- date: 2026-12-03")
    assert semantic_changes(original, body) == []


def test_a_line_in_a_fenced_block_or_an_element_never_leaves_it() -> None:
    system = (
        "You write commit messages.\nFollow this example:\n```\nfix: handle empty input\n\nDate: 2026-12-03\n```\n"
        "<env>\nToday: 2026-12-03\ncwd: /srv/app\n</env>\nKeep the subject under 50 characters."
    )
    original, body = shaped(system, ("user", "a"), ("assistant", "b"), ("user", "c"))
    assert semantic_changes(original, body) == []
    for unit in structures(system):
        assert any(unit in m["content"] for m in body["messages"] if m["role"] == "system")


def test_a_volatile_line_after_a_section_stays_where_it_would_join_the_section() -> None:
    # At the end of the head it would read as part of the "Rules" section.
    system = "Current time: 10:42.\nYou are Tern.\n# Rules\nBe safe.\nBe brief."
    original, body = shaped(system, ("user", "hi"), placement="end_of_system")
    assert body == original


def test_a_tool_parameter_block_moves_whole_with_its_tool() -> None:
    system = (
        "You are Forge.\n\n# Tools\n\n## read_file\nDescription: Read a file.\nParameters:\n"
        "- path: (required) relative to the current working directory /home/bo/app\n\n"
        "## list_files\nDescription: List a directory.\nParameters:\n- path: (required) the directory\n\n"
        "# Style\nBe brief."
    )
    model = StabilityModel()
    shaper = PolicyShaper(ShapingPolicy.model_validate({"learn_min_requests": 2}))
    for user in ("ana", "bo", "cy", "di"):
        original = {
            "messages": [
                {"role": "system", "content": system.replace("/home/bo", f"/home/{user}")},
                {"role": "user", "content": "hi"},
            ]
        }
        body = copy.deepcopy(original)
        shaper.shape(body, model)
        assert semantic_changes(original, body) == []
    assert (
        "## read_file\nDescription: Read a file.\nParameters:\n- path: (required)"
        in body["messages"][0]["content"]
    )


def test_retrieval_is_recognised_structurally_and_moves_whole_with_its_blank_lines() -> None:
    docs = (
        "<context>\n[1] Refunds take 5 days.\n\n[2] Shipping is free.\n\n    code stays indented\n</context>"
    )
    system = (
        "You are Acme's assistant.\nAnswer from the passages inside <context></context> XML tags.\n"
        f"{docs}\nCite passages by number."
    )
    original, body = shaped(system, ("user", "refund?"), rag={"enabled": True})
    content = body["messages"][0]["content"]
    assert content.endswith(docs)
    assert content.startswith(
        "You are Acme's assistant.\nAnswer from the passages inside <context></context> XML tags."
    )
    assert semantic_changes(original, body) == []


def test_a_marker_in_a_usage_example_is_not_the_retrieval_block() -> None:
    example = (
        "```\n<context>an example, not the passages</context>\n<context>\nstill the example\n</context>\n```"
    )
    system = f"You are DocBot.\nAn example:\n{example}\nBe brief."
    original, body = shaped(system, ("user", "q"), rag={"enabled": True})
    assert body == original


def test_per_session_values_go_to_the_end_of_the_system_message_per_request_ones_before_the_user() -> None:
    shaper = PolicyShaper(ShapingPolicy(placement="before_last_user"))
    history: list[dict[str, Any]] = []
    for turn in range(3):
        system = f"You are helpful.\nBe brief.\nToday is 2026-12-03.\nLocal time: 10:{turn:02d}."
        messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": f"q{turn}"}]
        body = {"messages": copy.deepcopy(messages)}
        result = shaper.shape(body)
        history += [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": "a"}]
    # The date did not change within the conversation: it stays with the system prompt.
    assert body["messages"][0]["content"] == "You are helpful.\nBe brief.\nToday is 2026-12-03."
    assert body["messages"][-2] == {"role": "system", "content": "Local time: 10:02."}
    assert result.header().endswith("; to=end:1,user:1")


def test_the_check_reports_a_broken_structure_a_changed_turn_and_a_reordered_schema() -> None:
    system = "Intro.\n<env>\ncwd: /x\n</env>\nRules:\n- a\n- b"
    original = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"properties": {"b": {}, "a": {}}}}}
        ],
    }
    broken = copy.deepcopy(original)
    broken["messages"][0]["content"] = "Intro.\n<env>\n</env>\nRules:\n- a\n- b\ncwd: /x"
    broken["messages"][1]["content"] = "hi!"
    broken["tools"][0]["function"]["parameters"]["properties"] = {"a": {}, "b": {}}
    problems = semantic_changes(original, broken)
    assert any(p.startswith("structure broken") for p in problems)
    assert "conversation turns changed" in problems
    assert any("order that means something" in p for p in problems)
    assert semantic_changes(original, copy.deepcopy(original)) == []


# Property: prompts assembled from structural pieces, some holding a volatile value.

_PIECES = [
    "You are helpful.",
    "Today is 2026-12-03.",
    "The user is Ana.",
    "Local time: 10:42.",
    "",
    "# Rules",
    "## Tools",
    "====",
    "System info:",
    "- cwd: /home/ana",
    "- date: 2026-12-03",
    "  continued detail",
    "```",
    "<env>",
    "</env>",
    "<context>",
    "</context>",
    "Name: Ana",
    "Plan: gold",
    "and a wrapped end",
    "| a | b |",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=14),
    st.sampled_from(["end_of_system", "before_last_user"]),
    st.booleans(),
)
# Once placed after "System info:" the block read as having that lead-in, looked retrieved anew
# on the next pass and moved again.
@example(["You are helpful.", "<context>", "</context>", "System info:"], "before_last_user", True)
# The dated sentence ends the system message after the final section, and reads back as its own unit.
@example(["Today is 2026-12-03.", "You are helpful.", "# Rules", "You are helpful."], "end_of_system", False)
def test_structured_prompts_keep_their_meaning_and_shape_once(
    pieces: list[str], placement: str, rag: bool
) -> None:
    system = "\n".join(pieces)
    assert "\n".join(units_of(system)) == system
    turns = (("user", "a"), ("assistant", "b"), ("user", "c"))
    policy = {"placement": placement, "rag": {"enabled": rag}}
    shaper = PolicyShaper(ShapingPolicy.model_validate(policy))
    messages = [{"role": "system", "content": system}] + [{"role": r, "content": c} for r, c in turns]
    original = {"messages": messages}
    _shape_twice(shaper, original)


def test_passages_retrieved_anew_each_turn_go_before_the_newest_user_turn_whole() -> None:
    shaper = PolicyShaper(
        ShapingPolicy.model_validate({"rag": {"enabled": True}, "placement": "before_last_user"})
    )
    history: list[dict[str, Any]] = []
    for turn in range(3):
        docs = f"<context>\n[1] Passage {turn}.\n\n[2] Another passage {turn}.\n</context>"
        system = f"You are Acme's assistant.\n{docs}\nCite passages by number."
        original = {
            "messages": [
                {"role": "system", "content": system},
                *history,
                {"role": "user", "content": f"q{turn}"},
            ]
        }
        body = copy.deepcopy(original)
        shaper.shape(body)
        assert semantic_changes(original, body) == []
        history += [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": "a"}]
    # The history stays a common prefix: the passages of this turn sit after it, whole.
    assert body["messages"][0]["content"] == "You are Acme's assistant.\nCite passages by number."
    assert body["messages"][-2] == {"role": "system", "content": docs}


def test_a_retrieval_block_never_lands_after_a_lead_in_and_shaping_twice_changes_nothing() -> None:
    system = "You are helpful.\n<context>\n</context>\nSystem info:"
    shaper = PolicyShaper(ShapingPolicy.model_validate({"rag": {"enabled": True}}))
    turns = [("user", "a"), ("assistant", "b"), ("user", "c")]
    original = {
        "messages": [{"role": "system", "content": system}] + [{"role": r, "content": c} for r, c in turns]
    }
    body = copy.deepcopy(original)
    shaper.shape(body)
    # After the lead-in it would read as what "System info:" introduces: it stays.
    assert body == original
    shaper.shape(body)
    assert body == original


def test_a_retrieval_block_is_known_by_its_element_lines_not_by_the_lead_in_before_it() -> None:
    # The same passages, once bare and once with a lead-in: not retrieved anew, nothing moves
    # before the newest user turn.
    docs = "<context>\n[1] Refunds take 5 days.\n</context>"
    shaper = PolicyShaper(ShapingPolicy.model_validate({"rag": {"enabled": True}}))
    history: list[dict[str, Any]] = []
    for system in (f"You are Acme's assistant.\n{docs}", f"You are Acme's assistant.\nPassages:\n{docs}"):
        body = {
            "messages": [{"role": "system", "content": system}, *history, {"role": "user", "content": "q"}]
        }
        shaper.shape(body)
        history += [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]


def test_per_request_values_go_after_the_newest_user_message_where_the_deployment_accepts_it() -> None:
    shaper = PolicyShaper(ShapingPolicy())  # after_last_turn: the previous turn stays cached too
    history: list[dict[str, Any]] = []
    for turn in range(3):
        system = f"You are helpful.\nBe brief.\nToday is 2026-12-03.\nLocal time: 10:{turn:02d}."
        messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": f"q{turn}"}]
        original = {"messages": messages}
        body = copy.deepcopy(original)
        result = shaper.shape(body)
        assert semantic_changes(original, body) == []
        history += [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": "a"}]
    assert body["messages"][0]["content"] == "You are helpful.\nBe brief.\nToday is 2026-12-03."
    assert body["messages"][-2:] == [
        {"role": "user", "content": "q2"},
        {"role": "system", "content": "Local time: 10:02."},
    ]
    assert result.header().endswith("; to=end:1,turn:1")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12),
    st.sampled_from(["end_of_system", "before_last_user", "after_last_tool", "after_last_turn"]),
    st.booleans(),
    st.booleans(),
)
def test_a_conversation_keeps_its_meaning_and_every_request_shapes_once(
    pieces: list[str], placement: str, rag: bool, agent: bool
) -> None:
    shaper = PolicyShaper(ShapingPolicy.model_validate({"placement": placement, "rag": {"enabled": rag}}))
    history: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for turn in range(4):
        system = "\n".join(pieces).replace("10:42", f"10:4{turn}").replace("Ana", f"Ana{turn % 2}")
        original = {"messages": [{"role": "system", "content": system}, *copy.deepcopy(history)]}
        _shape_twice(shaper, original)
        if agent:
            call = {"id": f"c{turn}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            history += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"},
            ]
        else:
            history += [{"role": "assistant", "content": "a"}, {"role": "user", "content": f"q{turn}"}]


# Issue #51 item 2: where a unit can only go to the end of the system message, a sentence that
# names what it is may end it after a final markdown section; nothing that depends on its
# neighbours does.
_CODING = (
    "The current date is {date}.\nYou are Lathe, a coding agent.\n\n## Working method\n"
    "1. Reproduce the problem first.\n2. Make the smallest change.\n\n## Reporting\n"
    "End with a short summary.\nKeep it under ten lines.\n"
)


def test_a_self_contained_sentence_ends_the_system_message_after_a_final_section() -> None:
    units = units_of("Intro.\n## Reporting\nKeep it short.\n\nThe current date is 2026-12-07.")
    assert units == ["Intro.", "## Reporting\nKeep it short.", "", "The current date is 2026-12-07."]
    shaper = PolicyShaper(ShapingPolicy.model_validate({"placement": "end_of_system"}))
    for session, date in enumerate(("2026-12-07", "2026-12-08")):
        history: list[dict[str, Any]] = [{"role": "user", "content": f"task {session}"}]
        for turn in range(3):
            system = _CODING.format(date=date)
            original = {"messages": [{"role": "system", "content": system}, *copy.deepcopy(history)]}
            body = copy.deepcopy(original)
            first = shaper.shape(body)
            head = body["messages"][0]["content"]
            assert head.startswith("You are Lathe") and head.endswith(
                f"lines.\nThe current date is {date}.\n"
            )
            assert semantic_changes(original, body) == []
            # Shaping the shaped request again: the same bytes and the same layout.
            once = copy.deepcopy(body)
            again = shaper.shape(body)
            assert body == once
            assert (again.prefix_hash, again.stable_prefix_tokens) == (
                first.prefix_hash,
                first.stable_prefix_tokens,
            )
            history += [
                {"role": "assistant", "content": f"step {turn}"},
                {"role": "user", "content": "go on"},
            ]


def test_a_unit_that_depends_on_its_neighbours_never_leaves_them_for_the_end() -> None:
    intro = "You are Lathe, a coding agent.\n\n## Reporting\nEnd with a short summary.\n"
    for system in (
        # A list item, a record's field, a line under a lead-in, a line that refers to the section.
        intro + "Dates:\n- The current date is 2026-12-07.\n- Be brief.",
        "Today: 2026-12-07\nShell: bash\n" + intro,
        intro + "Context for the summary:\nThe current date is 2026-12-07.",
        "These dates are 2026-12-07 and 2026-12-08.\n" + intro,
        # The sentence is the final section's only content: it stays under its heading.
        "You are Lathe.\n\n## Date\nThe current date is 2026-12-07.",
    ):
        original, body = shaped(system, ("user", "hi"), placement="end_of_system")
        assert semantic_changes(original, body) == [], system
        shaped_head = body["messages"][0]["content"]
        for unit in structures(system):
            assert unit in shaped_head, (system, unit)
        if system.startswith(("Today", "These")):
            assert body == original, system  # at the end it would read as part of "Reporting"
