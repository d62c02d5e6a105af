"""What the shaper remembers between requests changes nothing it decides: a conversation's
request read against its previous one (the replay), a template's last first-request decision,
its stable head and signed head, and the digit classes the detectors and line shapes are
memoized by."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.shaping.policy import DETECTORS, ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from gateway.shaping.units import _ENDS_CLAUSE, HEADING, level, line_kind, same_shape
from gateway.shaping.volatile import PATTERNS, Detectors
from tests.unit.shaping.test_units import _PIECES

_PLACEMENTS = ["end_of_system", "before_last_user", "after_last_tool", "after_last_turn"]


class _Afresh(PolicyShaper):
    """A shaper that decides every request from scratch and keeps no head between requests."""

    def _replayed(self, *args: Any, **kwargs: Any) -> None:
        return None

    def _stable(
        self, template: str, stable_idx: list[int], texts: list[str], hashes: list[str], whole: Any = None
    ) -> Any:
        self._stable_memo.clear()
        return super()._stable(template, stable_idx, texts, hashes)  # joined, never the whole head

    def _decided(self, *args: Any) -> Any:
        self._firsts.clear()
        return super()._decided(*args)

    def _head_signature(self, template: str, content: str) -> Any:
        self._signed_heads.clear()
        return super()._head_signature(template, content)


def _outcome(body: dict[str, Any], shaper: PolicyShaper, model: StabilityModel) -> tuple[Any, ...]:
    shaped = copy.deepcopy(body)
    r = shaper.shape(shaped, model)
    return shaped, r.header(), r.moves, r.prefix_hash, r.stable_prefix_tokens, r.head_stable_chars, r.segments


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12),
    st.sampled_from(_PLACEMENTS),
    st.booleans(),
    st.booleans(),
    st.lists(st.integers(0, 2), min_size=4, max_size=10),
)
def test_remembered_heads_decide_as_a_fresh_shaper(
    pieces: list[str], placement: str, rag: bool, agent: bool, users: list[int]
) -> None:
    # Three users' conversations interleaved, each request with a new time and a per-user
    # name; the learned model on from the fourth request.
    policy = ShapingPolicy.model_validate(
        {"placement": placement, "rag": {"enabled": rag}, "learn_min_requests": 3}
    )
    remembering, afresh = PolicyShaper(policy), _Afresh(policy)
    models = StabilityModel(), StabilityModel()
    histories: dict[int, list[dict[str, Any]]] = {}
    for n, user in enumerate(users):
        history = histories.setdefault(user, [{"role": "user", "content": f"task {user}"}])
        system = "\n".join(pieces).replace("10:42", f"10:{n:02d}").replace("Ana", f"Ana{user}")
        body = {"messages": [{"role": "system", "content": system}, *copy.deepcopy(history)]}
        assert _outcome(body, remembering, models[0]) == _outcome(body, afresh, models[1])
        if agent:
            call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            history += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{n}", "content": "ok"},
            ]
        else:
            history += [{"role": "assistant", "content": "a"}, {"role": "user", "content": f"q{n}"}]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12),
    st.sampled_from(_PLACEMENTS),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=4, max_size=12),
)
def test_first_requests_decide_as_a_fresh_shaper(
    pieces: list[str], placement: str, rag: bool, requests: list[tuple[int, int]]
) -> None:
    # Every request a new conversation (single-turn traffic: a template's last first request
    # is what the next one is decided against), with a new time, one of four names and none,
    # one or two earlier turns (a first request of a conversation the gateway never saw).
    policy = ShapingPolicy.model_validate(
        {"placement": placement, "rag": {"enabled": rag}, "learn_min_requests": 3}
    )
    remembering, afresh = PolicyShaper(policy), _Afresh(policy)
    models = StabilityModel(), StabilityModel()
    for n, (user, turns) in enumerate(requests):
        system = "\n".join(pieces).replace("10:42", f"10:{n:02d}").replace("Ana", f"Ana{user}")
        history: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {n}"}]
        for turn in range(turns):
            history += [{"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": f"q{turn}"}]
        body = {"messages": [{"role": "system", "content": system}, *history]}
        assert _outcome(body, remembering, models[0]) == _outcome(body, afresh, models[1])


class _FirstCounting(PolicyShaper):
    reused = 0

    def _decided(self, *args: Any) -> Any:
        before = dict(self._firsts)
        found = super()._decided(*args)
        self.reused += any(first.placed is found for first in before.values())
        return found


def test_a_templates_first_requests_reuse_its_last_decision() -> None:
    # Single-turn traffic: a new user and time on every request, learned from the fourth.
    policy = ShapingPolicy.model_validate({"learn_min_requests": 3})
    remembering, afresh = _FirstCounting(policy), _Afresh(policy)
    models = StabilityModel(), StabilityModel()
    for n in range(12):
        system = f"You are Forge.\nTime: 10:{n:02d}\nUser: Ana{n % 5}\n# Rules\n- be brief\n- cite files"
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"task {n}"}]}
        assert _outcome(body, remembering, models[0]) == _outcome(body, afresh, models[1])
    # Decided afresh: the first, and when the counts became known (the name found volatile).
    assert remembering.reused >= 8


class _Counting(PolicyShaper):
    replayed = 0

    def _replayed(self, *args: Any, **kwargs: Any) -> Any:
        found = super()._replayed(*args, **kwargs)
        self.replayed += found is not None
        return found


def test_a_conversation_under_way_is_replayed_and_shaped_as_afresh() -> None:
    policy = ShapingPolicy()
    remembering, afresh = _Counting(policy), _Afresh(policy)
    models = StabilityModel(), StabilityModel()
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix the build"}]
    for step in range(12):
        system = f"You are Forge.\n<env>\nTime: 10:{step:02d}\nCwd: /home/ana\n</env>\n# Rules\n- be brief"
        body = {"messages": [{"role": "system", "content": system}, *copy.deepcopy(history)]}
        assert _outcome(body, remembering, models[0]) == _outcome(body, afresh, models[1])
        history += [{"role": "assistant", "content": f"step {step}"}, {"role": "user", "content": "go on"}]
    # Every request after the first is read against the one before it.
    assert remembering.replayed == 11


_DETECTORS = Detectors(list(DETECTORS), [])
_DIGITS = st.text(st.sampled_from("0123456789"), min_size=1, max_size=12)
_WORDS = st.sampled_from(
    [
        "",
        " ",
        ":",
        "-",
        "/",
        "_",
        "T",
        "Z",
        "day",
        "Friday",
        "Dec",
        "req_",
        "run-",
        "ab",
        "Q",
        "# ",
        "- ",
        "1. ",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(_DIGITS, _WORDS), min_size=1, max_size=8), st.lists(_DIGITS, min_size=1, max_size=8)
)
def test_a_line_fires_and_has_its_shape_by_its_own_digits(parts: list[str], other_digits: list[str]) -> None:
    # A line whose digits change (a new time, a new id) fires exactly where its detectors
    # match, though memoized by its digits' classes; and its shape is the one its patterns say.
    detectors = _DETECTORS  # shared by the examples: what one memoized must hold for the next
    patterns = [re.compile(PATTERNS[d]) for d in DETECTORS]
    digits = iter(other_digits * 8)
    for line in ("".join(parts), "".join(next(digits) if p.isdigit() else p for p in parts)):
        assert detectors.fires(line) == any(p.search(line) for p in patterns), line
    first, second = "".join(parts), "".join(p[::-1] if p.isdigit() else p for p in parts)
    if "<" not in first and "`" not in first and "~" not in first:
        keys = [
            (k, level(line) if k == HEADING else 0, line.rstrip().endswith(_ENDS_CLAUSE), line[:1].islower())
            for line, k in ((line, line_kind(line)) for line in (first, second))
        ]
        assert same_shape(first, second) == (keys[0] == keys[1])


def test_a_unit_the_conversation_kept_stays_though_the_counts_now_call_it_volatile() -> None:
    # User A's name stayed in A's first request (nothing was known yet); by A's next request
    # the counts find it volatile, and another user's head was read in between (so A's name
    # line was read again): it still stays, as it does for a shaper that remembers nothing.
    policy = ShapingPolicy.model_validate({"learn_min_requests": 2})
    remembering, afresh = _Counting(policy), _Afresh(policy)
    models = StabilityModel(), StabilityModel()
    a: list[dict[str, Any]] = [{"role": "user", "content": "hi, I am A"}]
    b: list[dict[str, Any]] = [{"role": "user", "content": "hi, I am B"}]
    for n, (name, history) in enumerate((("Ana", a), ("Bo", b), ("Ana", a))):
        system = f"You are a helpful assistant.\n\nName: {name}\n\nLocal time: 10:0{n}\n\nBe brief."
        body = {"messages": [{"role": "system", "content": system}, *copy.deepcopy(history)]}
        shaped = _outcome(body, remembering, models[0])
        assert shaped == _outcome(body, afresh, models[1])
        history += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert remembering.replayed == 1
    assert shaped[0]["messages"][0]["content"] == "You are a helpful assistant.\n\nName: Ana\n\n\nBe brief."


def test_an_epoch_and_a_number_of_its_length_are_told_apart() -> None:
    detectors = Detectors(list(DETECTORS), [])
    lines = [
        "Started at 1700000000.",
        "Started at 1200000000.",
        "Started at 1900000000.",
        "Started at 2700000000.",
    ]
    assert [detectors.fires(line) for line in lines] == [True, False, True, False]


def test_the_shaped_tools_render_as_the_body_carries_them() -> None:
    """The checkpoints of a shaped request use the tools' bytes rendered once per tool set:
    they are the bytes the body's tools render to, request after request."""
    from gateway.prompt_render import render_chat

    def tool(name: str) -> dict[str, Any]:
        schema = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}
        return {
            "function": {"parameters": schema, "name": name, "description": "é \u00ed"},
            "type": "function",
        }

    shaper = PolicyShaper(ShapingPolicy())
    for turn in range(3):
        body = {
            "model": "fast",
            "messages": [
                {"role": "system", "content": f"Rules.\nTurn {turn}"},
                {"role": "user", "content": "hi"},
            ],
            "tools": [tool("read_file"), tool("edit_file"), tool("bash")],
        }
        result = shaper.shape(body, StabilityModel())
        assert result.rendered_tools is not None
        assert render_chat(body, result.rendered_tools) == render_chat(body)
        assert [t["function"]["name"] for t in body["tools"]] == ["bash", "edit_file", "read_file"]
    off = PolicyShaper(ShapingPolicy(canonical_json=False))
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool("b"), tool("a")]}
    assert off.shape(body, StabilityModel()).rendered_tools is None  # the body's own tools render


_SCHEMA = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
_TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.text(min_size=1, max_size=8),
                "parameters": st.dictionaries(st.text(max_size=6), _SCHEMA),
            }
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TOOL, min_size=1, max_size=4))
@pytest.mark.slow
def test_the_size_limits_tools_json_shapes_and_routes_as_written_afresh(tools: list[Any]) -> None:
    """The tools' JSON the size limits wrote is what shaping memoizes by and what routing
    measures: shaping with it leaves the same body, and the canonical tools it leaves are as
    long in JSON as the client's (only keys moved), which routing counts."""
    import orjson

    from gateway.api.protocol import check_limits
    from gateway.routing.features import structure

    def body() -> dict[str, Any]:
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": copy.deepcopy(tools)}

    given_body, afresh_body = body(), body()
    tools_json = check_limits(given_body, max_depth=64, max_messages=64, max_content_parts=64)
    assert tools_json == orjson.dumps(tools)
    PolicyShaper(ShapingPolicy()).shape(given_body, StabilityModel(), tools_json=tools_json)
    PolicyShaper(ShapingPolicy()).shape(afresh_body, StabilityModel())
    assert given_body == afresh_body
    assert structure(given_body, tool_chars=len(tools_json)) == structure(afresh_body)


# Keywords whose objects canonical form sorts or keeps in order, and other keys.
_KEYWORD = st.sampled_from(["type", "properties", "items", "enum", "default", "anyOf", "$defs", "x"])
_NODE = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_KEYWORD | st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=25,
)
_KEYED_TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.sampled_from("abc"), "parameters": _NODE}),
    },
    optional={"metadata": _NODE, "input_schema": _NODE},
)


def _rekeyed(node: Any, rng: Any) -> Any:
    """``node`` with some objects' keys (any object's: ``properties`` and literals too) in
    another order."""
    if isinstance(node, list):
        return [_rekeyed(v, rng) for v in node]
    if not isinstance(node, dict):
        return node
    keys = list(node)
    if rng.random() < 0.5:
        rng.shuffle(keys)
    return {k: _rekeyed(node[k], rng) for k in keys}


@settings(max_examples=120, deadline=None)
@given(st.lists(_KEYED_TOOL, min_size=1, max_size=4), st.randoms(use_true_random=False), st.booleans())
def test_tools_sent_again_in_another_key_order_shape_as_afresh(
    tools: list[Any], rng: Any, sort: bool
) -> None:
    """A tool known by its JSON with sorted keys reuses its canonical form only when the key
    orders canonical form keeps (``properties``, literals, a wrapper's other values) are the
    same: every request shapes as with a shaper that never saw the tools."""
    import orjson

    memo = PolicyShaper(ShapingPolicy(sort_tools=sort))
    for _ in range(4):
        sent = [_rekeyed(tool, rng) for tool in tools]
        rng.shuffle(sent)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": sent}
        again, afresh = copy.deepcopy(body), copy.deepcopy(body)
        a = memo.shape(again, StabilityModel())
        b = PolicyShaper(ShapingPolicy(sort_tools=sort)).shape(afresh, StabilityModel())
        assert orjson.dumps(again) == orjson.dumps(afresh)
        assert (a.header(), a.prefix_hash, a.rendered_tools) == (b.header(), b.prefix_hash, b.rendered_tools)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),  # counted (observed) before this read
            st.sampled_from([0.5, 0.8, 1.0]),  # the policy's stable share (policies share a model)
            st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_verdicts_read_against_the_last_are_the_counts_verdicts(
    steps: list[tuple[bool, float, list[tuple[int, bool]]]],
) -> None:
    """The verdicts of a template whose counts did not change since its last read are re-read
    only for the hashes that are not the very strings read then: whatever was counted in
    between, whichever share is asked, equal strings or the same ones, they are the counts'."""
    import math

    model = StabilityModel()
    pool = [f"{i:08x}" for i in range(6)]
    model.observe("t", pool[:3], None)
    for counted, share, picks in steps:
        # A shared string (as a head read against the last shares its unchanged units') or an
        # equal new one.
        hashes = [pool[p] if same else "".join(list(pool[p])) for p, same in picks]
        if counted:
            model.observe("t", hashes, None)
        got = model.verdicts("t", hashes, 1, share)
        counts = model._templates["t"]
        need = math.ceil(share * counts.n)
        assert got == [counts.lines.get(h, 0) >= need for h in hashes]
