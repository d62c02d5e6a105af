"""Anthropic cache breakpoints, measured: where the client puts them, nowhere, or where the
gateway puts them, on chat, agent-with-tools and RAG workloads against the simulator's
Messages API (explicit breakpoints only, 1,024-token minimum, 5-minute TTL, 20-block look-back).

    python bench/anthropic_breakpoints.py [--json FILE]

Each request runs the gateway's own code for this step: the shaper (learned stability,
retrieval moves on) and the anthropic provider's ``prepare`` (translation + breakpoint
placement), then goes to the simulator over HTTP; its usage is priced by the gateway's one
cost formula at 3.00 / 0.30 (cache read) / 15.00 USD per million input / cached / output
tokens, writes at 1.25x the input price.

Configurations (a fresh simulator cache each):

- ``none``: no marks anywhere (``cache_breakpoints: false``, the client places none);
- ``client``: the marks a typical client places: one at the end of its system prompt (and,
  for the agent, one on its last tool); the gateway places none;
- ``gateway``: the client places none; the gateway places them (the default).

Workloads: **chat**, 8 sessions of 6 turns, the system prompt opens with the current time
and the customer's name, then ~1,450 tokens of rules; **agent**, 6 tasks of 5 tool steps
with 20 tools (~2,300 tokens of schemas) and a short system prompt; **rag**, 30 questions,
each with ~700 tokens of retrieved passages in ``<context>`` inside the system prompt,
before the ~1,450 tokens of instructions.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.cachestats.cost import cost_usd
from gateway.dialects.anthropic.response import openai_usage
from gateway.policy import Deployment, Price
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import CacheHints
from gateway.shaping.policy import RagPolicy, ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from local_backend.sim import ModelProfile, SimConfig, SimThread

PRICE = Price(input=3.0, cached_input=0.3, output=15.0)
RULES = "\n".join(
    f"Rule {n}: answer questions about Acme orders, invoices and shipping precisely, citing the policy."
    for n in range(1, 61)
)
NAMES = ["Ana Lopez", "Bo Chen", "Cy Okafor", "Di Rossi", "Ed Novak", "Flo Berg", "Gus Iyer", "Hal Moreau"]
CONFIGS = ("none", "client", "gateway")
MARK = {"type": "ephemeral"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() // 1000 % 1_000_000:06d}Z"


def _system(text: str, client_marks: bool) -> dict[str, Any]:
    if not client_marks:
        return {"role": "system", "content": text}
    return {"role": "system", "content": [{"type": "text", "text": text, "cache_control": MARK}]}


def _tools(client_marks: bool) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for n in range(20):
        props = {
            f"arg_{k}": {
                "type": "string",
                "description": f"Argument {k} of tool {n}: an identifier or a filter.",
            }
            for k in range(4)
        }
        fn = {
            "name": f"tool_{n:02d}",
            "description": f"Tool {n} looks up one kind of Acme record by its fields and returns it as JSON.",
            "parameters": {"type": "object", "properties": props, "required": ["arg_0"]},
        }
        tools.append({"type": "function", "function": fn})
    if client_marks:
        tools[-1]["cache_control"] = MARK
    return tools


class Workload:
    """Requests built one at a time (a chat's next turn needs the previous answer)."""

    def __init__(self, kind: str, client_marks: bool) -> None:
        self.kind = kind
        self.client_marks = client_marks

    def sessions(self) -> list[list[Any]]:
        """Per session, a builder per request: ``(history) -> body``."""
        if self.kind == "chat":
            return [[self._chat(s, t) for t in range(6)] for s in range(len(NAMES))]
        if self.kind == "agent":
            return [[self._agent(task, step) for step in range(5)] for task in range(6)]
        return [[self._rag(q)] for q in range(30)]

    def _chat(self, s: int, t: int) -> Any:
        def build(history: list[dict[str, Any]]) -> dict[str, Any]:
            system = f"Current time: {_now()}\nThe customer is {NAMES[s]}.\n{RULES}"
            question = {
                "role": "user",
                "content": f"Session {s} question {t}: where is order {1000 + 17 * s + t}?",
            }
            return {"messages": [_system(system, self.client_marks), *history, question]}

        return build

    def _agent(self, task: int, step: int) -> Any:
        def build(history: list[dict[str, Any]]) -> dict[str, Any]:
            system = "You are Acme's operations agent. Use the tools; one tool per step; answer briefly."
            messages = [_system(system, self.client_marks)]
            if not history:
                messages.append({"role": "user", "content": f"Task {task}: reconcile invoice {5000 + task}."})
            return {
                "messages": messages + history,
                "tools": _tools(self.client_marks),
                "tool_choice": "required",
            }

        return build

    def _rag(self, q: int) -> Any:
        def build(history: list[dict[str, Any]]) -> dict[str, Any]:
            passages = "\n".join(
                f"[doc {q}.{d}] Shipment {q * 7 + d} left depot {d} with {q + d} parcels; see invoice {q}{d}."
                for d in range(28)
            )
            system = f"<context>\n{passages}\n</context>\n{RULES}"
            question = {"role": "user", "content": f"Question {q}: which depot handled shipment {q * 7 + 3}?"}
            return {"messages": [_system(system, self.client_marks), question]}

        return build


def _next_history(body: dict[str, Any], answer: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The conversation after this request (without the head system message)."""
    history = [m for m in body["messages"][1:] if m.get("role") != "system"]
    block = answer["content"][0]
    if kind == "agent" and block.get("type") == "tool_use":
        call = {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": "{}"}}
        result = f"record {block['id']}: " + "status ok; " * 40
        return [
            *history,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": block["id"], "content": result},
        ]
    text = block.get("text", "")
    return [*history, {"role": "assistant", "content": text}]


async def run_config(sim: SimThread, kind: str, config: str) -> dict[str, Any]:
    sim.control.reset()
    deployment = Deployment(
        provider="anthropic", base_url=sim.base_url, model="claude-sim", cache_breakpoints=config == "gateway"
    )
    provider = AnthropicProvider("claude", deployment)
    shaper = PolicyShaper(ShapingPolicy(rag=RagPolicy(enabled=True)))
    stability = StabilityModel()
    workload = Workload(kind, client_marks=config == "client")
    totals = {"prompt": 0, "read": 0, "written": 0, "cost_usd": 0.0, "requests": 0}
    async with aiohttp.ClientSession() as http:
        for session in workload.sessions():
            history: list[dict[str, Any]] = []
            for build in session:
                body = build(history)
                body["model"] = "claude"
                body["max_tokens"] = 40
                sent = copy.deepcopy(body)
                shape = shaper.shape(sent, stability, None, None)
                hints = CacheHints(shape.prefix_hash, shape.head_stable_chars, shape.head_stable_parts, True)
                request = provider.prepare(sent, stream=False, hints=hints).body
                async with http.post(sim.base_url + "/messages", json=request) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"{kind}/{config}: HTTP {resp.status}: {answer}")
                usage = openai_usage(answer["usage"])
                details = usage["prompt_tokens_details"]
                totals["prompt"] += usage["prompt_tokens"]
                totals["read"] += details["cached_tokens"]
                totals["written"] += details["cache_write_tokens"]
                totals["cost_usd"] += cost_usd(PRICE, usage)
                totals["requests"] += 1
                history = _next_history(body, answer, kind)
    await provider.close()
    return totals


async def measure() -> dict[str, dict[str, Any]]:
    """Every workload under every configuration."""
    config = SimConfig(models={"claude-sim": ModelProfile(ttft_ms=0, itl_ms=0, output_tokens=(30, 30))})
    results: dict[str, dict[str, Any]] = {}
    with SimThread(config) as sim:
        for kind in ("chat", "agent", "rag"):
            for name in CONFIGS:
                results[f"{kind}/{name}"] = await run_config(sim, kind, name)
    return results


def report(results: dict[str, dict[str, Any]], json_out: Path | None) -> int:
    """Print the table; 1 when the gateway's marks cost more than none on some workload."""
    columns = ("workload", "breakpoints", "requests", "prompt tokens", "read from cache", "written")
    print("| " + " | ".join(columns) + " | cost (USD) | vs none |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, row in results.items():
        kind, name = key.split("/")
        base = results[f"{kind}/none"]["cost_usd"]
        read, written = row["read"] / row["prompt"], row["written"] / row["prompt"]
        print(
            f"| {kind} | {name} | {row['requests']} | {row['prompt']:,} | {read:.1%} | {written:.1%} "
            f"| {row['cost_usd']:.4f} | {row['cost_usd'] / base - 1:+.1%} |"
        )
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    worse = [
        k
        for k in ("chat", "agent", "rag")
        if results[f"{k}/gateway"]["cost_usd"] > results[f"{k}/none"]["cost_usd"]
    ]
    return 1 if worse else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    return report(asyncio.run(measure()), parser.parse_args().json)


if __name__ == "__main__":
    raise SystemExit(main())
