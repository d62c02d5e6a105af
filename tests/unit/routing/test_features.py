"""Each routing feature, read from a request body."""

from __future__ import annotations

import orjson
import pytest

from gateway.routing.features import FEATURE_NAMES, extract, options_similarity


def chat(text: str, **extra: object) -> dict[str, object]:
    return {
        "model": "auto",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        **extra,
    }


def test_sizes_and_turns() -> None:
    f = extract(
        {
            "model": "auto",
            "messages": [
                {"role": "system", "content": "s" * 400},
                {"role": "user", "content": "u" * 40},
                {"role": "assistant", "content": "a" * 40},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "q" * 120}, {"type": "image_url", "image_url": {}}],
                },
            ],
        }
    )
    assert f.prompt_tokens == (400 + 40 + 40 + 120) // 4
    assert f.turns == 3
    assert f.last_user_chars == 120


def test_tools_json_limits_and_effort() -> None:
    f = extract(
        chat(
            "hi",
            tools=[{"type": "function", "function": {"name": "x"}}],
            response_format={"type": "json_schema", "json_schema": {}},
            max_tokens=900,
            reasoning_effort="high",
        )
    )
    assert f.has_tools and f.json_mode and f.max_tokens == 900 and f.reasoning_effort == 3.0
    plain = extract(chat("hi", response_format={"type": "text"}))
    assert (
        not plain.has_tools
        and not plain.json_mode
        and plain.max_tokens is None
        and plain.reasoning_effort is None
    )
    assert extract(chat("hi", max_completion_tokens=50)).max_tokens == 50


def test_prompt_tokens_count_the_tools_as_json() -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{n}", "parameters": {"type": "object"}}}
        for n in range(20)
    ]
    body = chat("hi", tools=tools)
    assert extract(body).prompt_tokens == (len("Be brief.") + 2 + len(orjson.dumps(tools))) // 4
    # An integer JSON can carry but orjson cannot write (beyond 64 bits) is measured all the same.
    huge = [{"type": "function", "function": {"name": "x", "parameters": {"maximum": 10**30}}}]
    assert extract(chat("hi", tools=huge)).prompt_tokens == (len("Be brief.") + 2 + len(str(huge))) // 4


def test_code_density() -> None:
    code = "Fix this:\n```python\ndef f(x):\n    return x + 1\n```"
    assert extract(chat(code)).code_density > 0.5
    assert extract(chat("The weather is nice today.\nLet's go outside.")).code_density == 0


def test_math_density() -> None:
    assert extract(chat("Solve x^2 + 3x = 10 and ∫ x dx")).math_density > 0.3
    assert extract(chat("Tell me a story about a dog")).math_density == 0


def test_reasoning_cues_are_word_starts() -> None:
    assert extract(chat("Prove it, then explain why, step by step.")).reasoning_cues == 4
    assert (
        extract(chat("Please improve this reasonable text")).reasoning_cues == 1
    )  # "reasonable", not "improve"


def test_questions_and_numbered_parts() -> None:
    f = extract(chat("What is A? And B?\n1. first\n2. second\n- third"))
    assert f.questions == 5


def test_script() -> None:
    assert extract(chat("hello")).non_ascii_share == 0
    assert extract(chat("请详细解释量子纠缠的原理")).non_ascii_share == 1.0


def test_hint_from_metadata_or_header() -> None:
    assert extract(chat("x", metadata={"switchyard_tier": "strong"})).hint == "strong"
    assert extract(chat("x"), hint="fast").hint == "fast"


def test_long_prompts_cost_the_same_the_features_read_both_ends() -> None:
    long = "Prove this. " + "filler text " * 5000 + " Why?"
    f = extract(chat(long))
    assert f.reasoning_cues == 2 and f.questions == 1
    assert f.prompt_tokens > 15000


def test_vector_is_normalized() -> None:
    f = extract(chat("Prove " * 50 + "?" * 50, max_tokens=10**6, reasoning_effort="medium"))
    vector = f.vector()
    assert set(vector) == set(FEATURE_NAMES)
    assert all(0.0 <= v <= 1.0 for v in vector.values())


def test_completions_prompt() -> None:
    f = extract({"model": "auto", "prompt": "Why is the sky blue?"})
    assert f.turns == 1 and f.reasoning_cues == 1 and f.questions == 1


def test_options_similarity_reads_lettered_answer_options() -> None:
    # MMLU's layout, "b)" and "(C)" styles; the largest Jaccard of two options' word sets.
    same = "Pick one.\nA. the cat sat\nB. The cat, sat.\nC. a dog ran\nD. birds"
    assert options_similarity(same) == 1.0  # case and punctuation do not count
    assert options_similarity("Pick one.\na) red\nb) blue") == 0.0
    abc = options_similarity("Q?\n(A) carbon dioxide gas\n(B) carbon monoxide gas\n(C) water")
    assert abc == 2 / 4  # {carbon, gas} of {carbon, dioxide, monoxide, gas}
    assert options_similarity("Q?\nA. 12 mg\nB. 15 mg") == 1 / 3  # numbers are words
    # The last lettered list counts: a question quoting its own list first.
    assert options_similarity("A. x y z\nB. x y z\nNow choose:\nA. red\nB. blue") == 0.0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("A. 4\nB. 1\nC. 256\nD. 16", 1.0),  # bare numbers differ only by the number
        ("A. -0.5\nB. 3/4\nC. $1,200\nD. 25 %", 1.0),
        ("A. 4\nB. 1\nC. none\nD. 16", 0.0),  # one option a word: the words' Jaccard
        ("A. red\nB. blue", 0.0),  # one-word options that are not numbers stay unalike
    ],
)
def test_options_that_are_bare_numbers_count_as_alike(options: str, expected: float) -> None:
    assert options_similarity("What is 4*1**4 in Python?\n" + options) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no options here",
        "A. one line only",
        "Q?\nA. only one option",
        "Q?\nB. starts at B\nC. then C",  # not lettered from A
        "Q?\nA. first\nC. skips B",
        "A plan.\nAt 3 p.m. we meet.",  # words that start with a capital letter and a dot
    ],
)
def test_text_without_a_lettered_list_of_options_has_none(text: str) -> None:
    assert options_similarity(text) is None
