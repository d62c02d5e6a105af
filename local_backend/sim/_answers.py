"""What one choice of an answer says: plain text, a JSON object, JSON that conforms to the
request's schema, or a tool call whose arguments conform to the tool's parameters; its
length in tokens and its finish reason. Deterministic: the seed comes from the prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from local_backend.sim._config import ModelProfile
from local_backend.sim._faults import FaultPlan
from local_backend.sim._request import dumps
from local_backend.sim._schema import instance, is_free_form
from local_backend.sim._tokens import (
    BYTES_PER_TOKEN,
    JSON_MIN_TOKENS,
    JSON_SUFFIX,
    answer_text,
    json_answer,
    natural_length,
    token_count,
)


@dataclass(slots=True)
class Choice:
    """One choice of an answer, decided before its first token goes out."""

    index: int
    text: str  # the content, or a tool call's arguments
    tokens: int
    finish_reason: str
    tool_name: str | None = None
    tool_id: str = ""


@dataclass(slots=True, frozen=True)
class Output:
    """What the request asks the answer to be: text, any JSON object, JSON that conforms to
    ``schema``, or a call of ``tool_name`` whose arguments conform to ``tool_parameters``."""

    json_object: bool = False
    schema: dict[str, Any] | None = None
    tool_name: str | None = None
    tool_parameters: dict[str, Any] | None = None


def _cut(natural: int, max_tokens: int | None, plan: FaultPlan) -> tuple[int, str]:
    """The tokens an answer of ``natural`` tokens gets, and its finish reason."""
    tokens, finish = natural, "stop"
    if plan.length_tokens is not None and plan.length_tokens < tokens:
        tokens, finish = plan.length_tokens, "length"
    if max_tokens is not None and max_tokens < tokens:
        tokens, finish = max_tokens, "length"
    return tokens, finish


def make_choice(
    index: int,
    seed: int,
    profile: ModelProfile,
    max_tokens: int | None,
    output: Output,
    plan: FaultPlan,
) -> Choice:
    """Choice ``index`` of an answer: what ``output`` asks for, cut by ``max_tokens`` and
    by the fault plan (``length``, ``bad_json``, ``empty``)."""
    if plan.empty:
        return Choice(index, "", 0, "stop")
    tool_name = output.tool_name
    if tool_name is not None:
        arguments = dumps(instance(output.tool_parameters or {}, seed)).decode()
        tokens = token_count((tool_name + arguments).encode())
        return Choice(index, arguments, tokens, "tool_calls", tool_name, f"call_{seed:08x}{index:016x}")
    if output.schema is not None and not is_free_form(output.schema):
        # The answer is as long as the schema makes it; max_tokens cuts it, as a model's.
        text = dumps(instance(output.schema, seed)).decode()
        tokens, finish = _cut(token_count(text.encode()), max_tokens, plan)
        if plan.bad_json:
            text = text[:-1]  # the closing bracket missing: not JSON
        text = text[: tokens * BYTES_PER_TOKEN]
        return Choice(index, text, token_count(text.encode()), finish)
    json_out = output.json_object or output.schema is not None or plan.bad_json
    natural = natural_length(seed, profile.output_tokens)
    if json_out:
        natural = max(natural, JSON_MIN_TOKENS)
    tokens, finish = _cut(natural, max_tokens, plan)
    if json_out:
        text = json_answer(seed, natural)
        if plan.bad_json:
            text = text[: -len(JSON_SUFFIX)]  # an unterminated string: not JSON
        text = text[: tokens * BYTES_PER_TOKEN]
    else:
        text = answer_text(seed, tokens * BYTES_PER_TOKEN)
    return Choice(index, text, token_count(text.encode()), finish)
