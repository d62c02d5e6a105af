"""Cost of the routing decision on the overhead benchmark's own request (short prompts).

    python bench/probes/routing_decision.py [--runs 20000] [--repeat 7]

``bench/overhead.sh --full`` routes every request: the non-stream one is scored by the
shipped ``ngram`` classifier after two rules on the model name miss, the stream one is
pinned by the first rule. This times ``Router.resolve`` (what the request path runs) for
exactly that policy and body (the ~1.5 KB system prompt and the user turn are read from
``bench/wrk/common.lua``), and, for comparison, the same body with the ``linear`` classifier
and a 2,000-token user message. Each figure is the best of ``--repeat`` timings of
``--runs`` calls, in microseconds per call (the best is the least disturbed by other work
on the machine). Run it with ``PYTHONPATH`` set to the tree to measure.
"""

from __future__ import annotations

import argparse
import re
import timeit
from pathlib import Path
from typing import Any

from gateway.config import parse_policy
from gateway.routing.features import extract
from gateway.routing.resolve import Router

COMMON_LUA = Path(__file__).resolve().parent.parent / "wrk" / "common.lua"

# overhead.sh's policy for the full gateway (write_policy ... full), ports aside.
FULL_POLICY = """
deployments:
  canned: {base_url: "http://127.0.0.1:1/v1", price: {input: 0.4, cached_input: 0.1, output: 1.6}}
  canned-stream: {base_url: "http://127.0.0.1:2/v1", price: {input: 0.4, cached_input: 0.1, output: 1.6}}
  canned-slow: {base_url: "http://127.0.0.1:2/slow/v1", price: {input: 0.4, cached_input: 0.1, output: 1.6}}
tiers:
  fast: [canned]
  strong: [canned-stream]
  slow: [canned-slow]
routing:
  route_all: true
  rules:
    - {name: bench_stream, when: {model: canned-stream}, tier: strong}
    - {name: bench_slow, when: {model: canned-slow}, tier: slow}
  classifier: {name: ngram}
  threshold: 1.0
"""
LINEAR = """  classifier:
    name: linear
    bias: -1.65
    weights: {prompt_tokens: 1.57, last_user_chars: 1.67, code_density: 0.74, math_density: 0.29,
              reasoning_cues: 3.35, questions: -0.38, non_ascii_share: 0.53}
"""
LINEAR_POLICY = FULL_POLICY.replace("  classifier: {name: ngram}\n", LINEAR)


def _lua_string(name: str) -> str:
    """A string constant of common.lua (``M.name = table.concat({...})`` or ``"..." .. "..."``)."""
    source = COMMON_LUA.read_text()
    start = source.index(f"M.{name} =")
    end = source.index("\n\n", start)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', source[start:end])
    return "".join(parts).encode().decode("unicode_escape")


def body_of(model: str, user: str, system: str) -> dict[str, Any]:
    """The benchmark's chat body (wrk/common.lua's ``M.body``)."""
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": 0.2,
        "max_tokens": 256,
        "user": "bench-user-0042",
        "stream": model == "canned-stream",
    }


def best_us(fn: Any, runs: int, repeat: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=runs, repeat=repeat)) / runs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    system, user = _lua_string("system_prompt"), _lua_string("user_turn")
    full, linear = Router(parse_policy(FULL_POLICY, "bench")), Router(parse_policy(LINEAR_POLICY, "bench"))
    nonstream, stream = body_of("canned", user, system), body_of("canned-stream", user, system)
    long_body = body_of("canned", (user + " ") * 50, system)
    print(
        f"system prompt {len(system)} chars, user turn {len(user)} chars; best of {args.repeat} x {args.runs}"
    )
    rows = [
        ("features (extract), bench body", lambda: extract(nonstream)),
        ("resolve, full policy, non-stream (ngram)", lambda: full.resolve(nonstream)),
        ("resolve, full policy, stream (rule)", lambda: full.resolve(stream)),
        ("resolve, linear, bench body", lambda: linear.resolve(nonstream)),
        ("resolve, full policy, 2k-token user turn", lambda: full.resolve(long_body)),
    ]
    for label, fn in rows:
        print(f"{label:42s} {best_us(fn, args.runs, args.repeat):7.2f} us")
    print(f"route header: {full.resolve(nonstream).header()} | {full.resolve(stream).header()}")


if __name__ == "__main__":
    main()
