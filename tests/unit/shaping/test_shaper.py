"""Prompt shaping: what moves, what never moves, and that shaping is idempotent."""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.shaping import signature
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from gateway.shaping.volatile import Detectors

INSTRUCTIONS = "You are the support assistant of Acme.\nAnswer in two sentences.\nNever promise refunds."


def request(system: str, *turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": role, "content": text} for role, text in turns]
    return {"model": "fast", "messages": messages, **extra}


def shaper(**policy: Any) -> PolicyShaper:
    # These tests were written for the placement before the newest user turn; the later
    # placements have their own tests (test_agent_loops, test_units).
    return PolicyShaper(ShapingPolicy.model_validate({"placement": "before_last_user", **policy}))


def tool(name: str, **params: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": params, "required": sorted(params)}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def test_a_dated_line_moves_into_a_system_message_before_the_newest_user_turn() -> None:
    body = request(
        "Today is 2026-12-03.\n" + INSTRUCTIONS,
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "refund?"),
    )
    result = shaper().shape(body)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "system", "user"]
    assert body["messages"][0]["content"] == INSTRUCTIONS
    assert body["messages"][3]["content"] == "Today is 2026-12-03."
    assert result.moved == 1
    assert result.header().startswith("moved=1; stable_prefix_tokens=")
    assert result.head_stable_chars == len(INSTRUCTIONS)


def test_end_of_system_placement_keeps_the_line_in_the_system_message() -> None:
    body = request("Today is 2026-12-03.\n" + INSTRUCTIONS, ("user", "hi"))
    shaper(placement="end_of_system").shape(body)
    assert body["messages"][0]["content"] == INSTRUCTIONS + "\nToday is 2026-12-03."
    assert len(body["messages"]) == 2


def test_the_stable_prefix_and_template_do_not_depend_on_the_volatile_line() -> None:
    results = []
    bodies = []
    for day, name in (("2026-12-03", "Ana"), ("2026-12-04", "Bo")):
        body = request(f"Today is {day}, session req-{name}12345.\n" + INSTRUCTIONS, ("user", "hi"))
        results.append(shaper(placement="end_of_system").shape(body))
        bodies.append(body)
    assert results[0].template == results[1].template
    assert results[0].prefix_hash == results[1].prefix_hash
    head = [b["messages"][0]["content"] for b in bodies]
    assert head[0][: len(INSTRUCTIONS)] == head[1][: len(INSTRUCTIONS)] == INSTRUCTIONS


def test_an_explicit_template_name_wins() -> None:
    result = shaper().shape(request(INSTRUCTIONS, ("user", "hi")), template="support-v2")
    assert result.template == "support-v2"
    assert "template=support-v2" in result.header()


def test_tools_are_sorted_by_name_and_their_schema_keywords_canonical() -> None:
    body = request(
        INSTRUCTIONS,
        ("user", "hi"),
        tools=[tool("search", q={"type": "string"}, k={"type": "integer"}), tool("add", b={}, a={})],
    )
    result = shaper().shape(body)
    assert [t["function"]["name"] for t in body["tools"]] == ["add", "search"]
    assert result.tools_sorted
    # The parameters keep the client's order: it is the order the model reads them in.
    assert list(body["tools"][1]["function"]["parameters"]["properties"]) == ["q", "k"]
    assert list(body["tools"][1]["function"]["parameters"]) == ["properties", "required", "type"]
    # The same tools with their keywords and wrapper keys in another order: the same bytes.
    other_tools = [tool("add", b={}, a={}), tool("search", q={"type": "string"}, k={"type": "integer"})]
    for t in other_tools:
        t["function"] = dict(reversed(list(t["function"].items())))
        params = t["function"]["parameters"]
        t["function"]["parameters"] = dict(reversed(list(params.items())))
    other = request(INSTRUCTIONS, ("user", "hi"), tools=other_tools)
    assert orjson.dumps(other["tools"]) != orjson.dumps(body["tools"])
    assert shaper().shape(other).prefix_hash == result.prefix_hash
    assert orjson.dumps(other["tools"]) == orjson.dumps(body["tools"])


def test_tool_call_arguments_keep_their_bytes_and_the_response_schema_is_canonical() -> None:
    body = request(
        INSTRUCTIONS,
        ("user", "hi"),
        response_format={"type": "json_schema", "json_schema": {"schema": {"b": 1, "a": 2}, "name": "x"}},
    )
    arguments = '{"z": 1e5, "a": [2, 1], "s": "\\u00ed"}'
    body["messages"].append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}],
        }
    )
    shaper().shape(body)
    # The bytes the model generated (and the provider cached) stay as they are.
    assert body["messages"][-1]["tool_calls"][0]["function"]["arguments"] == arguments
    assert list(body["response_format"]["json_schema"]) == ["name", "schema"]
    assert list(body["response_format"]["json_schema"]["schema"]) == ["a", "b"]
    # A client whose argument order varies can ask for them canonical.
    shaper(canonical_arguments=True).shape(body)
    assert body["messages"][-1]["tool_calls"][0]["function"]["arguments"].startswith('{"a":[2,1],')


def test_structured_output_properties_keep_their_generation_order() -> None:
    schema = {
        "type": "object",
        "properties": {
            "steps": {"type": "array", "items": {"type": "string"}},
            "final_answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
        },
        "required": ["steps", "final_answer"],
        "additionalProperties": False,
    }
    body = request(
        INSTRUCTIONS,
        ("user", "hi"),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "r", "strict": True, "schema": schema},
        },
    )
    shaper().shape(body)
    shaped = body["response_format"]["json_schema"]["schema"]
    assert list(shaped["properties"]) == ["steps", "final_answer"]
    assert shaped["required"] == ["steps", "final_answer"]
    assert shaped["properties"]["final_answer"]["enum"] == ["yes", "no", "unsure"]


def test_an_editor_tool_keeps_path_before_the_edit_text() -> None:
    editor = {
        "type": "function",
        "function": {
            "name": "replace_in_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to edit."},
                    "old_text": {"type": "string"},
                    "new_text": {"type": "string"},
                },
                "required": ["path", "old_text", "new_text"],
            },
        },
    }
    body = request(INSTRUCTIONS, ("user", "hi"), tools=[editor])
    shaper().shape(body)
    params = body["tools"][0]["function"]["parameters"]
    assert list(params["properties"]) == ["path", "old_text", "new_text"]
    assert params["required"] == ["path", "old_text", "new_text"]


def test_canonicalization_and_sorting_can_be_turned_off() -> None:
    tools = [tool("search", q={}, k={}), tool("add")]
    body = request(INSTRUCTIONS, ("user", "hi"), tools=copy.deepcopy(tools))
    shaper(sort_tools=False, canonical_json=False).shape(body)
    assert body["tools"] == tools
    assert orjson.dumps(body["tools"]) == orjson.dumps(tools)


def test_marked_retrieval_context_moves_as_one_block_after_the_instructions_when_enabled() -> None:
    docs = "<context>\n[1] Refunds take 5 days.\n[2] Shipping is free.\n</context>"
    system = "You are Acme's assistant.\n" + docs + "\nCite the passages by number."
    off = request(system, ("user", "refund?"))
    shaper().shape(off)
    assert off["messages"][0]["content"] == system  # opt-in: off by default
    on = request(system, ("user", "refund?"))
    result = shaper(rag={"enabled": True}).shape(on)
    assert on["messages"][0]["content"] == "You are Acme's assistant.\nCite the passages by number.\n" + docs
    assert result.rag_moved
    assert result.head_stable_chars == len("You are Acme's assistant.\nCite the passages by number.")


def test_two_retrieval_blocks_of_one_kind_stay_where_they_are() -> None:
    # Moving the first of two would swap them on every pass (found by the property test below).
    system = "<context>\n</context>\n<context>\nYou are helpful.\n</context>"
    body = request(system, ("user", "last"))
    result = shaper(rag={"enabled": True}, placement="end_of_system").shape(body)
    assert body["messages"][0]["content"] == system
    assert not result.rag_moved


def test_array_content_moves_whole_text_parts_and_never_an_image() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x.test/0123456789abcdef0123.png"}}
    parts = [
        {"type": "text", "text": "Current time: 10:42."},
        image,
        {"type": "text", "text": INSTRUCTIONS},
    ]
    body = request("", ("user", "hi"))
    body["messages"][0]["content"] = copy.deepcopy(parts)
    result = shaper(placement="end_of_system").shape(body)
    assert body["messages"][0]["content"] == [image, parts[2], parts[0]]
    assert result.moved == 1 and result.head_stable_parts == 2
    again = copy.deepcopy(body)
    assert shaper(placement="end_of_system").shape(again).moved == 0
    assert again == body


def test_the_learned_model_finds_a_volatile_line_no_detector_knows() -> None:
    model = StabilityModel()
    s = shaper(learn_min_requests=4)
    moved = []
    for name in ("Ana", "Bo", "Cy", "Di", "Ed", "Flo"):
        body = request(f"The user's name is {name}.\n" + INSTRUCTIONS, ("user", "hi"), ("user", "more"))
        moved.append(s.shape(body, model).moved)
    # The detectors see nothing; after four requests of the template the counts decide.
    assert moved == [0, 0, 0, 0, 1, 1]


def test_a_prompt_that_is_all_volatile_is_left_as_it_is() -> None:
    body = request("Today is 2026-12-03.\nRequest id req-abc12345.", ("user", "hi"))
    before = copy.deepcopy(body)
    result = shaper().shape(body)
    assert body == before and result.moved == 0


def test_disabled_shaping_changes_nothing() -> None:
    body = request("Today is 2026-12-03.\n" + INSTRUCTIONS, ("user", "hi"), tools=[tool("b"), tool("a")])
    before = copy.deepcopy(body)
    assert shaper(enabled=False).shape(body).moved == 0
    assert body == before


@pytest.mark.parametrize(
    ("line", "volatile"),
    [
        ("Today is 2026-12-03.", True),
        ("Date: 12/03/2026", True),
        ("It is December 3, 2026.", True),
        ("It is 3rd December 2026.", True),
        ("The time is 10:42 pm.", True),
        ("Today is Thursday.", True),
        ("Session 123e4567-e89b-12d3-a456-426614174000", True),
        ("Trace 9f86d081884c7d659a2feaa0c55ad015", True),
        ("Token dGhpc0lzQVZlcnlMb25nVG9rZW4xMjM0NTY3", True),
        ("Epoch 1764720000", True),
        ("request_id=req_8f3kd92la", True),
        ("You are a helpful assistant.", False),
        ("Answer in 2 sentences; never exceed 120 words.", False),
        ("Use the tools search and add.", False),
        ("Version 1.2.3 of the API.", False),
    ],
)
def test_the_detectors(line: str, volatile: bool) -> None:
    from gateway.shaping.policy import DETECTORS

    found, masked, _ = Detectors(list(DETECTORS), []).line(line)
    assert found is volatile
    assert ("<*>" in masked) is volatile


def test_a_policy_regex_marks_lines_volatile() -> None:
    body = request("Customer tier: GOLD\n" + INSTRUCTIONS, ("user", "hi"))
    shaper(placement="end_of_system", volatile_patterns=[r"Customer tier: \w+"]).shape(body)
    assert body["messages"][0]["content"].endswith("Customer tier: GOLD")


# Property tests: the invariants a user relies on, over generated prompts.

_line = st.one_of(
    st.sampled_from(
        [
            "You are helpful.",
            "Be brief.",
            "Today is 2026-12-03.",
            "Now: 10:42",
            "id 123e4567-e89b-12d3-a456-426614174000",
            "",
            "<context>",
            "</context>",
            "doc one",
        ]
    ),
    st.text(alphabet="abc xyz0123456789-:", max_size=30),
)
_turn = st.tuples(st.sampled_from(["user", "assistant"]), st.text(max_size=20))
_policy = st.fixed_dictionaries(
    {
        "placement": st.sampled_from(["end_of_system", "before_last_user"]),
        "rag": st.fixed_dictionaries({"enabled": st.booleans()}),
    }
)


def _turns(body: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"]) for m in body["messages"] if m["role"] != "system"]


def _system_lines(body: dict[str, Any]) -> Counter[str]:
    lines: Counter[str] = Counter()
    for m in body["messages"]:
        if m["role"] == "system":
            lines.update(line for line in m["content"].split("\n") if line.strip())
    return lines


@settings(max_examples=300, deadline=None)
@given(st.lists(_line, min_size=1, max_size=8), st.lists(_turn, max_size=5), _policy)
def test_shaping_keeps_turn_order_and_every_line_and_is_idempotent(
    lines: list[str], turns: list[tuple[str, str]], policy: dict[str, Any]
) -> None:
    body = request("\n".join(lines), *turns, ("user", "last"))
    original = copy.deepcopy(body)
    s = shaper(**policy)
    s.shape(body)
    assert _turns(body) == _turns(original)
    assert _system_lines(body) == _system_lines(original)
    once = copy.deepcopy(body)
    again = s.shape(body)
    assert body == once
    assert again.moved == 0


def _json_values(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none()
        | st.booleans()
        | integers
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
        max_leaves=12,
    )


# A request body's values are what orjson parsed (64-bit integers); a tool call's arguments
# are a string, holding any number: canonicalization must not round one.
_schema_json = _json_values(st.integers(-(2**63), 2**64 - 1))
_any_json = _json_values(st.integers())


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=5), _schema_json, max_size=5), _any_json)
def test_canonical_json_means_the_same(schema: dict[str, Any], arguments: Any) -> None:
    body = request(
        INSTRUCTIONS,
        ("user", "hi"),
        tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    raw_arguments = json.dumps(arguments)
    body["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": raw_arguments}}],
        }
    )
    shaper().shape(body)
    assert body["tools"][0]["function"]["parameters"] == schema
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert json.loads(body["messages"][-1]["tool_calls"][0]["function"]["arguments"]) == arguments


def test_odd_heads_are_left_alone() -> None:
    for content in ([], [{"type": "image_url", "image_url": {"url": "x"}}], "", "\n\n"):
        body = request("", ("user", "hi"))
        body["messages"][0]["content"] = copy.deepcopy(content)
        result = shaper().shape(body)
        assert body["messages"][0]["content"] == content and result.moved == 0


def test_signatures_are_kept_for_the_first_requests_of_a_template_then_sampled() -> None:
    s = shaper()
    kept = [bool(s.shape(request(INSTRUCTIONS, ("user", str(i)))).segments) for i in range(40)]
    assert kept[:20] == [True] * 20
    assert sum(kept[20:]) == 2


def test_a_busy_template_is_signed_at_most_twenty_times_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """One in ten of 1,000 requests in one second would be 100 signatures; the report reads
    the last 20."""
    clock = [1_000.25]
    monkeypatch.setattr(signature, "_now", lambda: clock[0])
    s = shaper()

    def signed(requests: int) -> int:
        return sum(bool(s.shape(request(INSTRUCTIONS, ("user", str(i)))).segments) for i in range(requests))

    assert signed(1_020) == 20 + 20  # the first 20 requests, then 20 in this second
    clock[0] += 0.5
    assert signed(200) == 0  # the same second
    clock[0] += 0.5
    assert signed(200) == 20  # the next one: one in ten again


def test_a_date_inside_the_retrieval_block_never_leaves_it() -> None:
    docs = "<context>\nPosted 2026-12-03: refunds take 5 days.\n</context>"
    for system in (
        f"{INSTRUCTIONS}\n{docs}",
        f"{docs}\n{INSTRUCTIONS}",
        f"Be brief.\n{docs}\n{INSTRUCTIONS}",
    ):
        body = request(system, ("user", "refund?"))
        shaper(rag={"enabled": True}, placement="end_of_system").shape(body)
        content = body["messages"][0]["content"]
        assert docs in content and content.endswith(docs)
