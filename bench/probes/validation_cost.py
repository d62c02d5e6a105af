"""CPU cost of validating a request body: pydantic's model against the quick exact-type check
that :func:`gateway.api.protocol.validate` tries first (issues #54, #55). Until 8 December
the quick check took only plain text messages with float sampling numbers, so a
deterministic request as clients write it (``"temperature": 0``, the one a response cache
keeps), every Anthropic Messages request (its blocks become typed content parts), a stream
asking for usage and every Responses request went to pydantic.

    .venv/bin/python bench/probes/validation_cost.py [--n 20000]

Prints microseconds per body (best of 5 rounds) for pydantic alone and for ``validate``;
every body here is valid, so ``validate`` is the quick check when it takes the body.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel

from gateway.api.protocol import ChatCompletionRequest, validate
from gateway.dialects.anthropic.inbound import to_chat_request
from gateway.dialects.responses.wire import ResponsesRequest

_SYSTEM = "You are the support assistant of an outdoor shop. " * 30
_TOOL_USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
_TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "shipped"}
_BODIES: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
    (
        "chat, temperature 0.2",
        ChatCompletionRequest,
        {
            "model": "fast",
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "Where is it?"}],
            "temperature": 0.2,
            "max_tokens": 256,
            "user": "u-1",
        },
    ),
    (
        "chat, temperature 0 (deterministic)",
        ChatCompletionRequest,
        {
            "model": "fast",
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "Where is it?"}],
            "temperature": 0,
            "max_tokens": 256,
            "user": "u-1",
        },
    ),
    (
        "chat stream with usage",
        ChatCompletionRequest,
        {
            "model": "fast",
            "messages": [{"role": "user", "content": "Where is it?"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "Anthropic Messages, an agent's step",
        ChatCompletionRequest,
        to_chat_request(
            {
                "model": "claude",
                "max_tokens": 256,
                "system": _SYSTEM,
                "messages": [
                    {"role": "user", "content": "Where is order 7?"},
                    {"role": "assistant", "content": [_TOOL_USE]},
                    {"role": "user", "content": [_TOOL_RESULT]},
                ],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            }
        ),
    ),
    (
        "Responses, a chat turn",
        ResponsesRequest,
        {"model": "fast", "instructions": _SYSTEM, "input": "Where is it?", "temperature": 0.2},
    ),
    (
        "Responses, an agent's step",
        ResponsesRequest,
        {
            "model": "fast",
            "instructions": _SYSTEM,
            "input": [
                {"role": "user", "content": "Where is order 7?"},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
            ],
            "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
            "tool_choice": "auto",
            "text": {"format": {"type": "text"}},
            "metadata": {"team": "support"},
        },
    ),
]


def _best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    n = parser.parse_args().n
    print("| body | pydantic | validate |\n|---|---|---|")
    for name, schema, raw in _BODIES:
        body = orjson.loads(orjson.dumps(raw))  # as parsed from the wire
        slow = _best_us(lambda s=schema, b=body: s.model_validate(b), n)
        quick = _best_us(lambda s=schema, b=body: validate(s, b), n)
        print(f"| {name} | {slow:.2f} µs | {quick:.2f} µs |")


if __name__ == "__main__":
    main()
