"""Request features for routing, computed from the body alone (no model call).

Everything here runs on every routed request, so each feature is a handful of C-level
string operations, not a tokenizer or a parse: the estimate of prompt tokens is
characters / 4 (OpenAI's rule of thumb for English), and the text features (code, math,
reasoning cues, questions, script) read the last user message — what decides how hard
the request is — or, when it is long, its first and last 600 characters, so the cost
does not grow with the prompt. That same bounded sample is kept as ``Features.text`` for
the classifiers that read words. The features read from the body's shape alone
(:func:`structure`) come first, so a rule that tests only those is decided without
reading the text at all.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# Each pattern is searched in "\n" + the text from a "\n" rather than from a MULTILINE "^":
# the same matches (none ends on a newline), but the regex engine jumps from newline to
# newline instead of testing the anchor at every character (half the time and less).
_CODE_LINE = re.compile(
    r"\n\s*(?:def |class |import |from \S+ import|return\b|for .* in |while |if .*:$|#include|function |"
    r"const |let |var |public |private |SELECT |INSERT |CREATE |}|\{$|.*;$|.*\) \{$|//|/\*)",
    re.MULTILINE,
)
# Word starts, searched in the lowercased text with a space in front: " prove" matches
# "prove", "proves", not "improve".
_CUES = (
    " prove", " proof", " deriv", " step by step", " step-by-step", " why", " explain", " analy",
    " compar", " justif", " reason", " evaluat", " trade-off", " tradeoff", " optimi", " design",
    " architect", " debug", " critiq", " theorem", " lemma",
)  # fmt: skip
# The cues count as the sum of each one's str.count. One alternation finds the same (one
# scan instead of 21): no cue is a prefix of another and none but " step by step" has a
# space after its first character, so two matches can never overlap, except that one
# with its inner spaces, which is counted on its own.
_SPACED_CUE = " step by step"


def _cue_pattern(cues: tuple[str, ...]) -> re.Pattern[str]:
    """One alternation of the cues, grouped by the letter after the space: the engine then
    tries the cues of one letter at a space, not all of them (the same matches: which cue
    matches at a position does not depend on the grouping)."""
    by_letter: dict[str, list[str]] = {}
    for cue in cues:
        by_letter.setdefault(cue[1], []).append(re.escape(cue[2:]))
    groups = "|".join(f"{re.escape(letter)}(?:{'|'.join(rests)})" for letter, rests in by_letter.items())
    return re.compile(f" (?:{groups})")


_CUE_STARTS = _cue_pattern(tuple(cue for cue in _CUES if cue != _SPACED_CUE))
_SAMPLE_CHARS = 600
_NUMBERED = re.compile(r"\n\s*(?:\d+[.)]|[-*•])\s+\S")
_MATH_SYMBOLS = ("∑", "∫", "√", "≤", "≥", "∂", "π")
_MATH_LATEX = ("\\frac", "\\sum", "\\int")
_EFFORT = {"minimal": 0.0, "low": 1.0, "medium": 2.0, "high": 3.0}

FEATURE_NAMES = (
    "prompt_tokens",
    "turns",
    "last_user_chars",
    "has_tools",
    "json_mode",
    "code_density",
    "math_density",
    "reasoning_cues",
    "questions",
    "max_tokens",
    "reasoning_effort",
    "non_ascii_share",
)
"""The features a classifier may weigh (each normalized to about [0, 1] by :meth:`Features.vector`)."""

RULE_FEATURES = (*FEATURE_NAMES, "hint", "model")
"""What a rule's ``when`` may test: the features, the client's tier hint, the model name asked for."""


@dataclass(slots=True)
class Features:
    """What the router knows about a request."""

    prompt_tokens: int
    turns: int
    last_user_chars: int
    has_tools: bool
    json_mode: bool
    code_density: float
    math_density: float
    reasoning_cues: int
    questions: int
    max_tokens: int | None
    reasoning_effort: float | None
    non_ascii_share: float
    hint: str | None
    model: str
    text: str = ""
    """The last user message, or its first and last 600 characters when longer: what content
    classifiers read (bounded, so their cost does not grow with the prompt)."""

    def vector(self) -> dict[str, float]:
        """Each feature scaled to about [0, 1], so weights are comparable."""
        return {
            "prompt_tokens": min(1.0, math.log1p(self.prompt_tokens) / math.log1p(32_000)),
            "turns": min(1.0, self.turns / 20.0),
            "last_user_chars": min(1.0, math.log1p(self.last_user_chars) / math.log1p(20_000)),
            "has_tools": 1.0 if self.has_tools else 0.0,
            "json_mode": 1.0 if self.json_mode else 0.0,
            "code_density": self.code_density,
            "math_density": self.math_density,
            "reasoning_cues": min(1.0, self.reasoning_cues / 5.0),
            "questions": min(1.0, self.questions / 5.0),
            "max_tokens": 0.0
            if self.max_tokens is None
            else min(1.0, math.log1p(self.max_tokens) / math.log1p(32_000)),
            "reasoning_effort": 0.0 if self.reasoning_effort is None else self.reasoning_effort / 3.0,
            "non_ascii_share": self.non_ascii_share,
        }

    def as_dict(self) -> dict[str, Any]:
        """The features (raw, not normalized) with the hint and the model, as rules see them."""
        return {name: getattr(self, name) for name in RULE_FEATURES}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _math_hits(sample: str) -> int:
    """Occurrences of the math markers; the symbols are looked for only in non-ASCII text,
    the LaTeX commands only where there is a backslash (each count is a scan)."""
    hits = sample.count("=") + sample.count("^") + sample.count("$")  # one scan each, no generator
    if not sample.isascii():
        hits += sum(sample.count(c) for c in _MATH_SYMBOLS)
    if "\\" in sample:
        hits += sum(sample.count(c) for c in _MATH_LATEX)
    return hits


@dataclass(slots=True)
class Structure:
    """The features read from the body's shape alone (no scan of the text): what a rule on
    these needs, without the text features' cost. :func:`complete` adds the rest."""

    prompt_tokens: int
    turns: int
    last_user_chars: int
    has_tools: bool
    json_mode: bool
    max_tokens: int | None
    reasoning_effort: float | None
    hint: str | None
    model: str
    last_user: str


STRUCTURE_FEATURES = frozenset(name for name in RULE_FEATURES if name in Structure.__slots__)
"""The rule features a :class:`Structure` holds (the rest need :func:`complete`)."""


def _json_chars(value: object) -> int:
    """The length of ``value`` as compact JSON: an agent's 20 tools (12 KB) measure in ~9 µs
    this way, ~105 µs through ``str``."""
    try:
        return len(orjson.dumps(value))
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: measured as its repr
        return len(str(value))


def tier_hint(body: Mapping[str, Any], hint: str | None) -> str | None:
    """The tier the client asks for: ``hint`` (the header's) when given, else the body's
    ``metadata.switchyard_tier``."""
    if hint is None:
        metadata = body.get("metadata")
        if isinstance(metadata, dict):
            given = metadata.get("switchyard_tier")
            hint = given if isinstance(given, str) else None
    return hint


def structure(body: Mapping[str, Any], hint: str | None = None, tool_chars: int | None = None) -> Structure:
    """The body-shape features of a chat (or completions) request body. ``tool_chars``: the
    length of its tool list's compact JSON, when the caller knows it."""
    messages = body.get("messages")
    total_chars = 0
    turns = 0
    last_user = ""
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            text = _text_of(message.get("content"))
            total_chars += len(text)
            role = message.get("role")
            if role in ("user", "assistant"):
                turns += 1
            if role == "user":
                last_user = text
    else:
        prompt = body.get("prompt")
        last_user = prompt if isinstance(prompt, str) else ""
        total_chars = len(last_user)
        turns = 1
    tools = body.get("tools")
    if tool_chars is None:
        tool_chars = _json_chars(tools) if tools else 0
    fmt = body.get("response_format")
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    effort = body.get("reasoning_effort")
    return Structure(
        (total_chars + tool_chars) // 4,
        turns,
        len(last_user),
        bool(tools),
        isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"),
        limit if isinstance(limit, int) else None,
        _EFFORT.get(effort) if isinstance(effort, str) else None,
        tier_hint(body, hint),
        str(body.get("model", "")),
        last_user,
    )


def complete(shape: Structure, text_features: bool = True) -> Features:
    """The features of a request whose :func:`structure` is ``shape``: the text features
    are read from its last user message (or that message's bounded sample). With
    ``text_features=False`` the five of them (code, math, cues, questions, script) are left
    at 0, unread: for a classifier that reads only ``Features.text`` and the body shape."""
    sample = shape.last_user
    if len(sample) > 2 * _SAMPLE_CHARS:
        sample = sample[:_SAMPLE_CHARS] + "\n" + sample[-_SAMPLE_CHARS:]
    code_density = math_density = non_ascii_share = 0.0
    reasoning_cues = questions = 0
    if text_features:
        n = max(1, len(sample))
        lines = sample.count("\n") + 1
        fences = sample.count("```")
        lined = "\n" + sample
        code_lines = len(_CODE_LINE.findall(lined)) if fences or lines > 1 else 0
        lowered = " " + sample.lower().replace("\n", " ")
        code_density = min(1.0, (code_lines + 3 * fences) / lines)
        math_density = min(1.0, 20.0 * _math_hits(sample) / n)
        reasoning_cues = len(_CUE_STARTS.findall(lowered)) + lowered.count(_SPACED_CUE)
        questions = sample.count("?") + len(_NUMBERED.findall(lined))
        # CJK text is 3 bytes a character in UTF-8, so this is about 1 for it, 0 for English.
        non_ascii_share = min(1.0, (len(sample.encode()) - len(sample)) / (2 * n))
    # Positional: a 15-field dataclass built with keywords costs half as much again.
    return Features(
        shape.prompt_tokens,
        shape.turns,
        shape.last_user_chars,
        shape.has_tools,
        shape.json_mode,
        code_density,
        math_density,
        reasoning_cues,
        questions,
        shape.max_tokens,
        shape.reasoning_effort,
        non_ascii_share,
        shape.hint,
        shape.model,
        sample,
    )


# An answer option: a line "A. ...", "b) ..." or "(C) ...". Searched from a "\n" put in front
# (as the patterns above), so the first line counts too.
_OPTION = re.compile(r"\n[ \t]*\(?([A-Ja-j])[.)][ \t]+([^\n]*)")
# An option's words: punctuation splits them (as UTF-8 bytes, a table lookup per byte).
_PUNCTUATION = bytes.maketrans(string.punctuation.encode(), b" " * len(string.punctuation))
# An option that is a number and nothing else: `12`, `-0.5`, `3/4`, `$1,200`, `25 %`.
_BARE_NUMBER = re.compile(r"\s*[-+$]?\d[\d.,/]*\s*%?\s*")


def options_similarity(text: str) -> float | None:
    """How alike the answer options of a multiple-choice question are: the largest Jaccard
    similarity of two options' sets of words (lowercased, split at spaces and punctuation;
    0 to 1), or None when ``text`` does not list at least two options lettered in order from
    A (the last such list counts).

    Options that differ by a word or a number ask for a careful reading, which is where a
    strong model gains most over a weak one: on held-out subjects of the routing data this
    alone ranks MMLU's "strong needed" questions better than the fitted n-grams do
    (docs/routing-quality.md). Options that are bare numbers (`A. 4`, `B. 16`) differ by
    nothing but the number, the extreme of that case, so they count as alike (1.0) although
    no two share a word: inside almost every subject they need the strong model more often
    than the subject's other questions do."""
    if "\n" not in text:
        return None
    options: list[str] = []
    for letter, option in _OPTION.findall("\n" + text):
        index = ord(letter.upper()) - 65
        if index == 0:
            options = [option]
        elif index == len(options):
            options.append(option)
        else:
            options = []
    if len(options) < 2:
        return None
    if all(_BARE_NUMBER.fullmatch(option) for option in options):
        return 1.0
    sets = [
        set(option.lower().encode("utf-8", "surrogatepass").translate(_PUNCTUATION).split()) or {b""}
        for option in options
    ]
    best = 0.0
    for i, first in enumerate(sets):
        for second in sets[i + 1 :]:
            shared = len(first & second)
            best = max(best, shared / (len(first) + len(second) - shared))
    return best


def extract(body: Mapping[str, Any], hint: str | None = None) -> Features:
    """The features of a chat (or completions) request body."""
    return complete(structure(body, hint))
