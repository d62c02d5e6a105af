"""The simulator's structured output: values that validate against the request's schema."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from local_backend.sim._schema import instance, is_free_form

Validator = jsonschema.Draft202012Validator


def _valid(value: Any, schema: dict[str, Any]) -> None:
    Validator(schema, format_checker=Validator.FORMAT_CHECKER).validate(value)
    json.dumps(value)  # plain JSON, nothing a client could not parse


# --- the supported subset, as a hypothesis strategy ------------------------------------

_words = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_scalars = st.sampled_from(["red", "green", 1, 2.5, True, None])


@st.composite
def _integer(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    low = draw(st.none() | st.integers(-1000, 1000))
    span = draw(st.integers(0, 500))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        high = (low if low is not None else 0) + span + 12  # room for a multiple of 5
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
        if draw(st.booleans()):
            schema["multipleOf"] = draw(st.sampled_from([1, 2, 5]))
    return schema


@st.composite
def _number(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number"}
    low = draw(st.none() | st.floats(-1e6, 1e6, allow_nan=False))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        base = low if low is not None else 0.0
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = base + draw(st.floats(0.5, 1e6))
    return schema


@st.composite
def _string(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    fmt = draw(
        st.none() | st.sampled_from(["date-time", "date", "time", "email", "uuid", "ipv4", "ipv6", "uri"])
    )
    if fmt is not None:
        schema["format"] = fmt
        return schema
    low = draw(st.integers(0, 40))
    schema["minLength"] = low
    if draw(st.booleans()):
        schema["maxLength"] = low + draw(st.integers(0, 40))
    return schema


_leaves = st.one_of(
    _integer(),
    _number(),
    _string(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(_scalars, min_size=1, max_size=4, unique=True).map(lambda e: {"enum": e}),
    _scalars.map(lambda c: {"const": c}),
)


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.dictionaries(_words, children, max_size=5).flatmap(
        lambda props: st.builds(
            lambda required, closed: {
                "type": "object",
                "properties": props,
                "required": required,
                **({"additionalProperties": False} if closed else {}),
            },
            st.lists(st.sampled_from(list(props)), unique=True) if props else st.just([]),
            st.booleans(),
        )
    )
    arrays = st.builds(
        lambda items, low, extra, unique: {
            "type": "array",
            "items": items,
            "minItems": low,
            "maxItems": low + extra,
            **({"uniqueItems": True} if unique else {}),
        },
        children,
        st.integers(0, 3),
        st.integers(0, 3),
        st.just(False),
    )
    nullable = children.map(lambda c: {"anyOf": [c, {"type": "null"}]})
    either = st.lists(children, min_size=1, max_size=3).map(lambda cs: {"anyOf": cs})
    return st.one_of(objects, arrays, nullable, either)


_trees = st.recursive(_leaves, _extend, max_leaves=12)
# A definition referenced by $ref, and a merged allOf, around any of the above.
_with_defs = st.builds(
    lambda defined, other: {
        "$defs": {"D": defined},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/D"}, "b": {"allOf": [other]}},
        "required": ["a", "b"],
    },
    _trees,
    _trees,
)
_schemas = st.one_of(_trees, _with_defs)


@settings(max_examples=300, deadline=None)
@given(schema=_schemas, seed=st.integers(0, 2**32 - 1))
def test_generated_values_validate_against_generated_schemas(schema: dict[str, Any], seed: int) -> None:
    _valid(instance(schema, seed), schema)


@settings(max_examples=100, deadline=None)
@given(schema=_schemas, seed=st.integers(0, 2**32 - 1))
def test_the_same_schema_and_seed_give_the_same_value(schema: dict[str, Any], seed: int) -> None:
    assert json.dumps(instance(schema, seed)) == json.dumps(instance(schema, seed))


# --- what pydantic and the SDKs send ---------------------------------------------------


class Step(BaseModel):
    explanation: str
    output: str


class Tree(BaseModel):
    name: str
    children: list[Tree]


class Answer(BaseModel):
    steps: list[Step] = Field(min_length=2, max_length=4)
    final_answer: str
    mood: Literal["happy", "sad"]
    score: float = Field(ge=0, le=1)
    count: int = Field(gt=3, lt=9, multiple_of=2)
    maybe: int | None
    tree: Tree
    tags: list[str] = Field(min_length=1)


@pytest.mark.parametrize("seed", range(20))
def test_a_pydantic_model_with_defs_refs_and_recursion(seed: int) -> None:
    schema = Answer.model_json_schema()
    value = instance(schema, seed)
    _valid(value, schema)
    parsed = Answer.model_validate(value)
    assert list(value) == list(schema["properties"])  # every property, in schema order
    assert 2 <= len(parsed.steps) <= 4 and parsed.count in (4, 6, 8)


def test_ref_to_the_root_stops_at_the_depth_bound() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["name", "next"],
    }
    value = instance(schema, 7)
    _valid(value, schema)
    assert "next" in value


def test_free_form_objects_are_recognised() -> None:
    assert is_free_form({"type": "object"}) and is_free_form({"title": "x"})
    assert not is_free_form({"type": "object", "properties": {}}) and not is_free_form({"type": "array"})
