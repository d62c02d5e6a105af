"""What the gateway's own steps cost on an agent's request, in process (no HTTP).

    python bench/agent_request.py [--tools 20] [--steps 4] [--runs 1000]

The overhead benchmark's request is a chat turn without tools. An agent's is not: a long
system prompt (``bench/shaping.py``'s 130-line coding agent), ``--tools`` tools of ~600 bytes
of JSON each (``bench/routing_features.py``'s), and ``--steps`` tool calls with their
results. For a fresh parse of that body on every call it times each step of a request's
preparation: parsing, the size limits (nesting depth, counts), validation, shaping with the
checkpoint chain, and routing (``overhead.sh --full``'s policy), each alone (writing the
tools' JSON it needs) and the four chained as the pipeline chains them (the JSON the size
limits write handed on). Prints the best of three means, in microseconds per request.
Run it with ``PYTHONPATH`` set to the tree to measure.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from probes.routing_decision import FULL_POLICY
from routing_features import tool_of
from shaping import agent_system_prompt

from gateway.api.protocol import ChatCompletionRequest, check_limits, validate
from gateway.cachestats.chain import checkpoints
from gateway.config import parse_policy
from gateway.routing.resolve import Router
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel

Step = Callable[[dict[str, Any]], object]
"""One step of a request's preparation, on a parsed body."""


def agent_body(tools: int, steps: int) -> bytes:
    """An agent's request at its ``steps``-th tool call, as JSON."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": agent_system_prompt(130)},
        {"role": "user", "content": "The test in tests/test_app.py fails since the last commit: fix it."},
    ]
    for k in range(steps):
        arguments = orjson.dumps({"arg_0": "src/app.py", "arg_1": str(k)}).decode()
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "tool_1", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": "ok: 1 file changed\n" * 40})
    return orjson.dumps({"model": "auto", "messages": messages, "tools": [tool_of(n) for n in range(tools)]})


def per_request(step: Step, raw: bytes, runs: int) -> float:
    """Mean microseconds of ``step`` over ``runs`` freshly parsed bodies, best of three."""
    best = float("inf")
    for _ in range(3):
        bodies = iter([orjson.loads(raw) for _ in range(runs)])
        best = min(best, timeit.timeit(_stepper(step, bodies), number=runs) / runs * 1e6)
    return best


def _stepper(step: Step, bodies: Iterator[dict[str, Any]]) -> Callable[[], object]:
    """``step`` on the next body, per call."""
    return lambda: step(next(bodies))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    raw = agent_body(args.tools, args.steps)
    shaper, stability = PolicyShaper(ShapingPolicy()), StabilityModel()
    router = Router(parse_policy(FULL_POLICY, "bench"))

    def limits(body: dict[str, Any]) -> None:
        check_limits(body, max_depth=64, max_messages=2048, max_content_parts=256)

    def shaping(body: dict[str, Any]) -> None:
        checkpoints(body, shaper.shape(body, stability).rendered_tools)

    def chained(body: dict[str, Any]) -> None:
        # As the pipeline chains them: the tools' JSON the size limits write is handed on.
        tools_json = check_limits(body, max_depth=64, max_messages=2048, max_content_parts=256)
        validate(ChatCompletionRequest, body)
        checkpoints(body, shaper.shape(body, stability, tools_json=tools_json).rendered_tools)
        router.resolve(body, tool_chars=len(tools_json) if tools_json is not None else None)

    steps: dict[str, Step] = {
        "parse (orjson)": lambda body: orjson.loads(raw),
        "size limits": limits,
        "validation": lambda body: validate(ChatCompletionRequest, body),
        "shaping and checkpoints": shaping,
        "routing (ngram)": router.resolve,
        "the four, chained": chained,
    }
    print(f"agent request: {len(raw):,} bytes, {args.tools} tools, {args.steps} tool calls; us per request")
    for name, step in steps.items():
        print(f"  {name:<24} {per_request(step, raw, args.runs):7.1f}")


if __name__ == "__main__":
    main()
