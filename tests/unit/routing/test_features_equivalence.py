"""The text features' fast formulation counts exactly what the plain one did: each pattern
anchored at every line start, each cue and math marker counted by ``str.count``."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.routing import features

# The formulation before issue #20 round 2, kept here as the reference.
_CODE_LINE = re.compile(
    r"^\s*(?:def |class |import |from \S+ import|return\b|for .* in |while |if .*:$|#include|function |"
    r"const |let |var |public |private |SELECT |INSERT |CREATE |}|\{$|.*;$|.*\) \{$|//|/\*)",
    re.MULTILINE,
)
_NUMBERED = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+\S", re.MULTILINE)
_MATH_CHARS = ("=", "^", "∑", "∫", "√", "≤", "≥", "∂", "π", "\\frac", "\\sum", "\\int", "$")


def _reference(sample: str) -> tuple[int, int, int, int]:
    lowered = " " + sample.lower().replace("\n", " ")
    return (
        len(_CODE_LINE.findall(sample)),
        len(_NUMBERED.findall(sample)),
        sum(sample.count(c) for c in _MATH_CHARS),
        sum(lowered.count(cue) for cue in features._CUES),
    )


def _fast(sample: str) -> tuple[int, int, int, int]:
    lined = "\n" + sample
    lowered = " " + sample.lower().replace("\n", " ")
    return (
        len(features._CODE_LINE.findall(lined)),
        len(features._NUMBERED.findall(lined)),
        features._math_hits(sample),
        len(features._CUE_STARTS.findall(lowered)) + lowered.count(features._SPACED_CUE),
    )


# Pieces that make the patterns match, half-match and overlap, joined at random.
_PIECES = st.sampled_from(
    [
        "\n", "\n\n", " ", "  ", "\t", "\r", "\x0b", "\u2028", "x", "Why", " why", "prove", " proof",
        " step by step", " step-by-step", " step by step-by-step", "trade-off", " tradeoffs",
        "def f():", "return", "returns", "for x in y", "if a:", "}", "{", ";", ") {", "//", "/*",
        "from a import b", "1.", "12)", "- ", "* ", "•", "1. item", "=", "^", "$", "π", "∑", "\\frac",
        "\\sum", "\\int", "\\", "?", "SELECT ", "#include", "éß", "İ", "中文",
    ]
)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES | st.text(max_size=6), max_size=40).map("".join))
@example(" step by step by step\n\n  \n  x;\n1.\n\n a")
@example("\n\n- \n* x\n  }\n")
def test_fast_text_features_count_what_the_plain_ones_did(sample: str) -> None:
    assert _fast(sample) == _reference(sample)
