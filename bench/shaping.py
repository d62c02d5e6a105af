"""Prompt shaping, measured: three generated workloads replayed through the gateway to the
simulator, shaping off vs on, in both of the simulator's cache models; and shaping's own cost.

    python bench/shaping.py [--prefill-ms-per-1k 50] [--concurrency 4] [--json FILE]

Workloads (each prompt is over 1,024 tokens, so OpenAI-style caching applies):

a. **chat**: 12 sessions of 6 turns; the system prompt starts with the current time (to the
   microsecond) and the customer's name (no detector knows a name: the learned stability
   model must find it), then 60 lines of stable rules.
b. **agent**: 10 tasks of 4 steps of an agent loop (tool call, tool result, ...) with 20
   tools, sent in a different order, with their schema keywords in a different order, each
   time (their properties in one order: it is the order the model reads them in).
c. **rag**: 40 questions; the retrieved passages sit in ``<context>`` between two halves
   of the instructions.

Configurations, each on a fresh gateway (and its own embedded Redis) and an emptied
simulator cache:

- ``off``: ``shaping: {enabled: false}``;
- ``on``: the default policy (moves before the newest user turn), retrieval moves enabled;
- ``on-end``: the same with ``placement: end_of_system``;
- ``ideal``: shaping off, and each request written by the generator with every stable part
  first (instructions, history, sorted canonical tools) — the share if all stable content
  formed a common prefix.

For each it prints the simulator-reported cached-token share (``cached_tokens`` over
``prompt_tokens`` of the streamed answers' usage) and TTFT p50 (the simulator's prefill
costs ``--prefill-ms-per-1k`` per 1,000 uncached tokens). Then shaping's cost per request
(shaper, stability model, checkpoint chain) for a 4,200-token prompt whose system message
has 40 or 130 lines and for a 12,500-token agent prompt of 556 lines, each in three traffic
patterns (one conversation, 50 interleaved, a new conversation on every request): median
and p99 of 2,000 runs. Exits 1 when ``on`` is below 90 % of
``ideal`` for a workload.

The template corpus (``tests/fixtures/templates/``): its short sessions in vLLM's cache model
(under OpenAI's 1,024 tokens), its long sessions (``--sessions``; long answers and tool
results) in both; per template off / on / on with ``end_of_system`` / bound / reachable and
the semantic check in both placements, then the issue #51 done-when checks (exits 1 when one
fails).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--import-root" in sys.argv:
    # One side of --baseline's A/B: this file's prompts against another checkout's gateway.
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--import-root") + 1]).resolve()))

from gateway.procutil import free_port, serving
from gateway.shaping.canonical import canonical_wrapper
from gateway.shaping.check import semantic_changes
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.shaper import PolicyShaper
from gateway.shaping.stability import StabilityModel
from tests.fixtures.templates import corpus

ROOT = Path(__file__).resolve().parent.parent
RULES = [
    f"Rule {n}: answer questions about Acme orders, invoices and shipping precisely, citing the policy."
    for n in range(1, 61)
]  # about 1,450 tokens
NAMES = ["Ana Lopez", "Bo Chen", "Cy Okafor", "Di Rossi", "Ed Novak", "Flo Berg", "Gus Iyer", "Hal Moreau"]
NAMES += ["Ivy Tanaka", "Jo Silva", "Kai Weber", "Lu Haddad"]
CONFIGS = ("off", "on", "on-end", "ideal")
RAG_CONFIGS = (*CONFIGS, "reachable")  # some corpus templates are also written as reachable


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() // 1000 % 1_000_000:06d}Z"


def chat_workload(ideal: bool) -> list[list[dict[str, Any]]]:
    """Per session, the request bodies of its turns (built lazily is not needed: time is read
    when the body is built, just before it is sent, by :func:`_stamp`)."""
    sessions = []
    for s, name in enumerate(NAMES):
        turns = []
        history: list[dict[str, Any]] = []
        for t in range(6):
            question = f"Session {s} question {t}: where is order {1000 + 17 * s + t}?"
            volatile = f"Current time: {{now}}\nThe customer is {name}."
            if ideal:
                messages = [
                    {"role": "system", "content": "\n".join(RULES)},
                    *history,
                    {"role": "system", "content": volatile},
                    {"role": "user", "content": question},
                ]
            else:
                messages = [
                    {"role": "system", "content": volatile + "\n" + "\n".join(RULES)},
                    *history,
                    {"role": "user", "content": question},
                ]
            turns.append({"messages": messages})
            history = [
                *history,
                {"role": "user", "content": question},
                {"role": "assistant", "content": f"Order {1000 + 17 * s + t} left the warehouse on time."},
            ]
        sessions.append(turns)
    return sessions


def _tools(rng: random.Random | None) -> list[dict[str, Any]]:
    tools = []
    for n in range(20):
        props = {
            f"arg_{k}": {
                "type": "string",
                "description": f"Argument {k} of tool {n}: an identifier or a filter.",
            }
            for k in range(4)
        }
        if rng is not None and rng.random() < 0.5:
            # A serializer's keyword order varies; the properties' order is the client's
            # (it is the order the model reads the parameters in) and never does.
            props = {k: dict(reversed(list(v.items()))) for k, v in props.items()}
        fn = {
            "name": f"tool_{n:02d}",
            "description": f"Tool {n} looks up one kind of Acme record by its fields and returns it as JSON.",
            "parameters": {
                "type": "object",
                "properties": props,
                "required": ["arg_0", "arg_1"],
            },
        }
        if rng is not None and rng.random() < 0.5:
            fn = dict(reversed(list(fn.items())))
        tools.append({"type": "function", "function": fn})
    if rng is not None:
        rng.shuffle(tools)
        return tools
    return [canonical_wrapper(t) for t in tools]  # sorted, canonical


def agent_workload(ideal: bool) -> list[list[dict[str, Any]]]:
    rng = random.Random(7)
    system = "You are Acme's operations agent. Use the tools; call one tool per step; answer briefly."
    sessions = []
    for task in range(10):
        steps = []
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {task}: reconcile invoice {5000 + task} with its shipment."},
        ]
        for step in range(4):
            steps.append({"messages": copy.deepcopy(messages), "tools": _tools(None if ideal else rng)})
            call_id = f"call_{task}_{step}"
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": f"tool_{step:02d}", "arguments": '{"arg_0": "x"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": f'{{"record": {task * 10 + step}}}'},
            ]
        sessions.append(steps)
    return sessions


PASSAGES = [
    f"[{n}] Acme policy note {n}: " + "orders ship within two business days; refunds take five; " * 3
    for n in range(30)
]
HALF_1 = "\n".join(RULES[:30])
HALF_2 = "\n".join(RULES[30:])


def rag_workload(ideal: bool) -> list[list[dict[str, Any]]]:
    rng = random.Random(11)
    requests = []
    for q in range(40):
        context = "<context>\n" + "\n".join(rng.sample(PASSAGES, 3)) + "\n</context>"
        system = f"{HALF_1}\n{HALF_2}\n{context}" if ideal else f"{HALF_1}\n{context}\n{HALF_2}"
        body = {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {q}: how long does a refund take?"},
            ]
        }
        requests.append(body)
    return [requests[i::4] for i in range(4)]  # four clients, each asking in turn


WORKLOADS = {"chat": chat_workload, "agent": agent_workload, "rag": rag_workload}


def _sessions(template: corpus.Template, long: bool) -> list[list[dict[str, Any]]]:
    """The template's bench sessions: 8 users x 5 turns; ``long``: with long answers and tool
    results (over OpenAI's 1,024-token minimum from the second request of a session on). The
    long sessions draw their values with another seed: replayed on the gateway that saw the
    short ones, the same times to the microsecond would make each long session's second request
    read as a retry of a short one's (the same question and time, another answer)."""
    return corpus.sessions(template, users=8, turns=5, seed=5 if long else 3, long_history=long)


def _bound_values(template: corpus.Template, long: bool = False) -> list[list[dict[str, Any]]]:
    """The template's workload with no value varying (every request the first one's system
    prompt, the tools in one order):
    an upper bound for what any order of its content could have cached."""
    bound = []
    first = corpus.sessions(template, users=1, turns=1)[0][0]["messages"][0]
    for bodies in _sessions(template, long):
        for body in bodies:
            body["messages"][0] = copy.deepcopy(first)
            if "tools" in body:
                body["tools"] = copy.deepcopy(template.tools)
        bound.append(bodies)
    return bound


_RAG_OPEN, _RAG_CLOSE = ("<context>", "<documents>"), ("</context>", "</documents>")


def _reachable_rag(template: corpus.Template, long: bool = False) -> list[list[dict[str, Any]]]:
    """A retrieval template's workload written the best way any meaning-preserving shaping
    could send it when passages change on every request: the retrieval block (its element
    lines, with the heading or lead-in line it reads under) out of the system prompt and, whole,
    in a system message after the newest message, on every turn. The instructions and the
    whole history before the newest message are then a common prefix; the passages, new on
    every request, never can be."""
    out = _sessions(template, long)
    for bodies in out:
        for body in bodies:
            messages = body["messages"]
            lines = messages[0]["content"].split("\n")
            start = next(i for i, line in enumerate(lines) if line.strip() in _RAG_OPEN)
            end = next(i for i in range(start, len(lines)) if lines[i].strip() in _RAG_CLOSE)
            above = lines[start - 1].strip() if start else ""
            if above.startswith("#") or above.endswith(":"):
                start -= 1
            rest = lines[:start] + lines[end + 1 :]
            if 0 < start < len(rest) and not rest[start].strip() and not rest[start - 1].strip():
                del rest[start]  # one blank line where the block was, not two
            messages[0]["content"] = "\n".join(rest)
            messages.append({"role": "system", "content": "\n".join(lines[start : end + 1])})
    return out


def _reachable_section_late(
    template: corpus.Template, heading: str, long: bool = False
) -> list[list[dict[str, Any]]]:
    """The template's workload with the markdown section under ``heading`` (it holds a value new
    on every request beside per-session ones) out of the system prompt and, whole, in a system
    message after the newest message on every request: the latest place, so the history stays
    a common prefix; the section's per-session lines are then sent anew each step."""
    out = _sessions(template, long)
    for bodies in out:
        for body in bodies:
            messages = body["messages"]
            lines = messages[0]["content"].split("\n")
            start = lines.index(heading)
            level = len(heading) - len(heading.lstrip("#"))
            end = next(
                (i for i in range(start + 1, len(lines)) if lines[i].startswith("#" * level + " ")),
                len(lines),
            )
            section = lines[start:end]
            while section and not section[-1].strip():
                section.pop()
            messages[0]["content"] = "\n".join(lines[:start] + lines[end:])
            messages.append({"role": "system", "content": "\n".join(section)})
    return out


def _reachable_unmarked_rag(template: corpus.Template, long: bool = False) -> list[list[dict[str, Any]]]:
    """As :func:`_reachable_rag`, for a retrieval block framed by two identical rules under the
    line that announces it ("Context information is below.")."""
    out = _sessions(template, long)
    for bodies in out:
        for body in bodies:
            messages = body["messages"]
            lines = messages[0]["content"].split("\n")
            start = next(i for i, line in enumerate(lines) if line.startswith("Context information"))
            rule = lines[start + 1]
            end = next(i for i in range(start + 2, len(lines)) if lines[i] == rule)
            messages[0]["content"] = "\n".join(lines[:start] + lines[end + 1 :])
            messages.append({"role": "system", "content": "\n".join(lines[start : end + 1])})
    return out


def _reachable_lines(
    template: corpus.Template, late: str, last: tuple[str, ...], long: bool = False
) -> list[list[dict[str, Any]]]:
    """The template's workload with the line starting with ``late`` (new on every request) in
    a system message after the newest message, and the lines starting with one of ``last``
    (fixed within a session), with the lead-in line they follow, at the end of the system
    message: the best layout of whole units (what changes within a session after the
    history, what differs between sessions after what all share)."""
    out = _sessions(template, long)
    for bodies in out:
        for body in bodies:
            messages = body["messages"]
            lines = messages[0]["content"].split("\n")
            late_lines = [line for line in lines if late and line.startswith(late)]
            moved = [i for i, line in enumerate(lines) if line.startswith(last)]
            if moved and moved[0] > 0 and lines[moved[0] - 1].endswith(":"):
                moved.insert(0, moved[0] - 1)  # the lead-in moves with its list
            kept = [
                line
                for i, line in enumerate(lines)
                if i not in moved and not (late and line.startswith(late))
            ]
            messages[0]["content"] = "\n".join([*kept, *(lines[i] for i in moved)])
            if late_lines and len(messages) > 2:
                messages.append({"role": "system", "content": "\n".join(late_lines)})
            elif late_lines:
                messages[0]["content"] += "\n" + "\n".join(late_lines)
    return out


REACHABLE: dict[str, Callable[[corpus.Template, bool], list[list[dict[str, Any]]]]] = {
    "rag_rules_unmarked": _reachable_unmarked_rag,
    "session_env_chat": lambda t, long: _reachable_lines(
        t, "The current time is", ("- Name:", "- Operating system:", "- Shell for", "- Locale:"), long
    ),
    "coding_markdown_tail": lambda t, long: _reachable_lines(t, "", ("The current date is",), long),
    # Per-session values only (the working directory in three units, the first inside the
    # tools section): every other order of whole units shares less across users.
    "xml_tool_agent": _sessions,
    "terminal_sections": lambda t, long: _reachable_section_late(t, "# Environment", long),
    "rag_handbook": _reachable_rag,
    "rag_sources_fenced": _reachable_rag,
}
"""Per template, its workload written in the best layout of whole units that keeps its meaning
(the ``reachable`` column: an upper bound for shaping that never breaks a unit)."""


def corpus_workload(template: corpus.Template, config: str, long: bool = False) -> list[list[dict[str, Any]]]:
    """A corpus template's sessions (8 users x 5 turns; ``long``: with long answers and tool
    results); ``ideal`` is the no-variation bound, ``reachable`` (the templates of
    :data:`REACHABLE`) the best meaning-preserving layout."""
    if config == "ideal":
        return _bound_values(template, long)
    if config == "reachable":
        out = REACHABLE[template.name](template, long)
        for bodies in out:  # sent with shaping off: the tools as shaping would send them
            for body in bodies:
                if "tools" in body:
                    tools = sorted(body["tools"], key=lambda t: str(t["function"]["name"]))
                    body["tools"] = [canonical_wrapper(t) for t in tools]
        return out
    return _sessions(template, long)


def semantic_check(template: corpus.Template, policy: dict[str, Any], long: bool = False) -> int:
    """Shaped bodies of the template's workload that changed meaning (in process, learning as
    the gateway does)."""
    shaper = PolicyShaper(ShapingPolicy.model_validate(policy))
    model = StabilityModel()
    changed = 0
    sessions = _sessions(template, long)
    for turn in range(5):
        for bodies in sessions:
            shaped = copy.deepcopy(bodies[turn])
            shaper.shape(shaped, model)
            changed += bool(semantic_changes(bodies[turn], shaped))
    return changed


def _stamp(body: dict[str, Any]) -> dict[str, Any]:
    """The body as sent: ``{now}`` filled with the time of sending."""
    raw = orjson.dumps(body).decode().replace("{now}", _now())
    out: dict[str, Any] = orjson.loads(raw)
    return out


def _policy(sim_url: str, config: str) -> str:
    shaping = {
        "off": "shaping: {enabled: false}",
        "ideal": "shaping: {enabled: false}",
        "reachable": "shaping: {enabled: false}",
        "on": "shaping: {rag: {enabled: true}}",
        "on-end": "shaping: {placement: end_of_system, rag: {enabled: true}}",
    }[config]
    # No placement set for the deployment: the gateway asks the simulator's /tokenize what
    # its chat template accepts (a system message anywhere), as it asks a real vLLM.
    return f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim_url}/v1"}}
tiers:
  fast: [sim-fast]
  strong: [sim-fast]
{shaping}
"""


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, int, float]:
    """(prompt_tokens, cached_tokens, ttft_s) of one streamed request."""
    payload = {
        **body,
        "model": "fast",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = 0.0
    usage: dict[str, Any] = {}
    async with session.post(url, json=payload) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = orjson.loads(line[6:])
            if not ttft and event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - started
            if event.get("usage"):
                usage = event["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(usage.get("prompt_tokens", 0)), int(cached), ttft


async def _replay(url: str, sessions: list[list[dict[str, Any]]], concurrency: int) -> dict[str, float]:
    results: list[tuple[int, int, float]] = []
    queue = list(sessions)

    async def worker(http: aiohttp.ClientSession) -> None:
        while queue:
            results.extend([await _one(http, url, _stamp(body)) for body in queue.pop(0)])

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    prompt = sum(r[0] for r in results)
    return {
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_share": sum(r[1] for r in results) / prompt if prompt else 0.0,
        "ttft_p50_ms": 1000 * statistics.median(r[2] for r in results),
    }


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-shaping-") as tmp:
        return _run_matrix(args, Path(tmp))


def _run_matrix(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    table: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_") and k != "REDIS_URL"}
    for cache_model in ("vllm", "openai"):
        sim_port = free_port()
        sim_cmd = [
            sys.executable,
            "-m",
            "local_backend.sim",
            "--port",
            str(sim_port),
            "--model",
            "sim-fast:5:1",
        ]
        sim_cmd += ["--cache-model", cache_model, "--prefill-ms-per-1k", str(args.prefill_ms_per_1k)]
        sim_url = f"http://127.0.0.1:{sim_port}"
        with serving(sim_cmd, sim_url + "/health", log=tmp / f"sim-{cache_model}.log", cwd=ROOT):
            for config in RAG_CONFIGS:
                policy = tmp / f"policy-{config}.yaml"
                policy.write_text(_policy(sim_url, config))
                port = free_port()
                gw_cmd = [
                    sys.executable,
                    "-m",
                    "gateway",
                    "serve",
                    "--port",
                    str(port),
                    "--policy",
                    str(policy),
                ]
                gw_log = tmp / f"gw-{config}.log"
                with serving(gw_cmd, f"http://127.0.0.1:{port}/healthz", log=gw_log, env=env, cwd=ROOT):
                    # The short sessions' prompts are under OpenAI's 1,024-token minimum: vLLM's
                    # model only; the long sessions (long answers and tool results) in both.
                    lengths = [(False, "t:")] if cache_model == "vllm" and args.sessions != "long" else []
                    lengths += [(True, "l:")] if args.sessions != "short" else []
                    for (long, prefix), template in itertools.product(
                        lengths, corpus.TEMPLATES if args.corpus else ()
                    ):
                        if config == "reachable" and template.name not in REACHABLE:
                            continue
                        _post(sim_url + "/sim/reset")
                        url = f"http://127.0.0.1:{port}/v1/chat/completions"
                        sessions = corpus_workload(template, config, long)
                        row = asyncio.run(_replay(url, sessions, args.concurrency))
                        table.setdefault(cache_model, {}).setdefault(f"{prefix}{template.name}", {})[
                            config
                        ] = row
                        print(
                            f"  {cache_model:6} {prefix}{template.name:20} {config:6} cached "
                            f"{100 * row['cached_share']:5.1f}%  TTFT p50 {row['ttft_p50_ms']:6.1f} ms",
                            file=sys.stderr,
                        )
                    for name, make in WORKLOADS.items() if not args.corpus_only else ():
                        if config == "reachable":
                            continue
                        _post(sim_url + "/sim/reset")
                        row = asyncio.run(
                            _replay(
                                f"http://127.0.0.1:{port}/v1/chat/completions",
                                make(config == "ideal"),
                                args.concurrency,
                            )
                        )
                        table.setdefault(cache_model, {}).setdefault(name, {})[config] = row
                        print(
                            f"  {cache_model:6} {name:5} {config:6} cached {100 * row['cached_share']:5.1f}%"
                            f"  TTFT p50 {row['ttft_p50_ms']:6.1f} ms",
                            file=sys.stderr,
                        )
    return table


def _post(url: str) -> None:
    import urllib.request

    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10):
        pass


def agent_system_prompt(lines: int = 556) -> str:
    """A coding agent's system prompt of ``lines`` lines (about 12,000 tokens at 556): an
    environment element with the time, the working directory and the OS, then sections of
    rules, tool documentation with parameter lists and usage examples in code fences."""
    out = [
        "You are Forge, an autonomous coding agent working in the user's repository.",
        "",
        "<env>",
        "Current time: {now}",
        "Working directory: /home/ana/projects/app",
        "Platform: linux",
        "</env>",
        "",
    ]
    n = 0
    while len(out) < lines - 1:
        n += 1
        out += [f"# Area {n}: how to work on part {n} of a change", ""]
        out += [
            f"- Rule {n}.{k}: read the files you change first, keep each diff minimal, run the "
            f"tests that cover them and report what you ran, with its output, and never guess a "
            f"file path (rule {k})."
            for k in range(1, 9)
        ]
        out += [
            "",
            f"## tool_{n}",
            f"Description: does step {n} of a change in the workspace and "
            "reports what it did, one line per file it touched.",
            "Parameters:",
        ]
        out += [
            f"- arg_{k}: (required) value {k} of the call, relative to the working directory"
            for k in range(4)
        ]
        out += ["Usage:", "```", f"<tool_{n}><arg_0>src/app.py</arg_0></tool_{n}>", "```", ""]
    return "\n".join([*out[: lines - 1], "Answer in the user's language."])


PATTERNS = {
    "one conversation": lambda i: 0,
    "50 interleaved": lambda i: i % 50,
    "new conversation each request": lambda i: i,
}
"""How the cost bench's requests belong to conversations: request ``i``'s conversation."""


def shaping_cost(
    system_lines: int, runs: int = 2000, agent: bool = False, pattern: str = "one conversation"
) -> dict[str, Any]:
    """PolicyShaper + stability model + checkpoint chain for a 4,200-token prompt whose system
    message has ``system_lines`` lines (the rest is conversation), per request: CPU time
    of the measuring thread, so other load on the machine does not count. With ``agent``,
    the system message is :func:`agent_system_prompt` (a real-size agent prompt, ~12k
    tokens at 556 lines) with the time changing on every request.

    ``pattern`` (see :data:`PATTERNS`) says which conversation each request belongs to: one
    conversation throughout, 50 conversations taking turns, or a new one on every request.
    A conversation has its user's name in the system prompt (50 users) and its own first
    user message; every request ends with a new user message."""
    from redis.asyncio import Redis

    from gateway.cachestats.chain import checkpoints
    from gateway.shaping.policy import ShapingPolicy
    from gateway.shaping.shaper import PolicyShaper
    from gateway.shaping.stability import StabilityModel
    from gateway.store.writer import StatsWriter

    if agent:
        system = agent_system_prompt(system_lines).replace("/home/ana", "/home/Ana Lopez")
    else:
        lines = [f"Current time: {_now()}", "The customer is Ana Lopez."]
        lines += [f"{rule} (section {n})" for n, rule in enumerate(RULES * 3)][: system_lines - 2]
        system = "\n".join(lines)
    history = "Where is my order? It left on Monday. " * (max(0, 15_000 - len(system)) // 38 + 1)
    body = {
        "model": "fast",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Ticket CONVERSATION. " + history},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "NEWEST"},
        ],
        "tools": _tools(random.Random(1))[:3],
    }
    raw = orjson.dumps(body)
    conversation_of = PATTERNS[pattern]
    shaper = PolicyShaper(ShapingPolicy())
    stability = StabilityModel()
    writer = StatsWriter(Redis())  # never flushed: counters stay in memory
    times = []
    for i in range(runs):
        conversation = conversation_of(i)
        fresh = orjson.loads(
            raw.replace(b"Ana Lopez", f"Name {conversation % 50:02d}".encode())
            .replace(b"{now}", f"10:{i % 3600:04d}".encode())
            .replace(b"CONVERSATION", str(conversation).encode())
            .replace(b"NEWEST", f"Any news? This is my message {i}, sent at 10:{i % 3600:04d}.".encode())
        )
        started = time.thread_time()
        shaped = shaper.shape(fresh, stability, writer)
        # The tools' bytes as shaping rendered them (what the gateway passes on); a checkout
        # from before they were kept (``--baseline``) renders them itself.
        rendered = getattr(shaped, "rendered_tools", None)
        checkpoints(fresh, rendered) if rendered is not None else checkpoints(fresh)
        times.append(time.thread_time() - started)
    tokens = len(raw) // 4
    times.sort()
    return {
        "system": "agent" if agent else "rules",
        "system_lines": system_lines,
        "pattern": pattern,
        "prompt_tokens": tokens,
        "min_us": 1e6 * times[0],
        "median_us": 1e6 * times[len(times) // 2],
        "p99_us": 1e6 * times[int(len(times) * 0.99)],
    }


def _shuffled_keys(node: Any, rng: random.Random) -> Any:
    """``node`` with every object's keys in a random order but a schema's ``properties`` (here,
    not from the corpus module: ``--baseline`` imports an older checkout's tests)."""
    if isinstance(node, list):
        return [_shuffled_keys(v, rng) for v in node]
    if not isinstance(node, dict):
        return node
    keys = list(node)
    rng.shuffle(keys)
    return {
        k: {n: _shuffled_keys(v, rng) for n, v in node[k].items()}
        if k == "properties" and isinstance(node[k], dict)
        else _shuffled_keys(node[k], rng)
        for k in keys
    }


def tools_cost(runs: int = 1000) -> dict[str, Any]:
    """Shaping's cost (shaper and checkpoint chain) for a request whose 20 tools come in a
    new order, each with its keys and schema keywords in a new order (their properties in
    one: that order is meaning): the first shape of that tool list, every time."""
    from redis.asyncio import Redis

    from gateway.cachestats.chain import checkpoints
    from gateway.shaping.policy import ShapingPolicy
    from gateway.shaping.shaper import PolicyShaper
    from gateway.shaping.stability import StabilityModel
    from gateway.store.writer import StatsWriter

    rng = random.Random(11)
    tools = _tools(None)
    shaper = PolicyShaper(ShapingPolicy())
    stability = StabilityModel()
    writer = StatsWriter(Redis())
    system = "\n".join(RULES)
    times = []
    for i in range(runs):
        order = [_shuffled_keys(tool, rng) for tool in tools]
        rng.shuffle(order)
        body = orjson.loads(
            orjson.dumps(
                {
                    "model": "fast",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"Task {i}: find the order."},
                    ],
                    "tools": order,
                }
            )
        )
        started = time.thread_time()
        shaped = shaper.shape(body, stability, writer)
        rendered = getattr(shaped, "rendered_tools", None)
        checkpoints(body, rendered) if rendered is not None else checkpoints(body)
        times.append(time.thread_time() - started)
    times.sort()
    return {
        "system": "rules",
        "system_lines": len(RULES),
        "pattern": "20 tools, a new key order each request",
        "prompt_tokens": len(orjson.dumps(body)) // 4,
        "min_us": 1e6 * times[0],
        "median_us": 1e6 * times[len(times) // 2],
        "p99_us": 1e6 * times[int(len(times) * 0.99)],
    }


def shaping_costs() -> list[dict[str, Any]]:
    """:func:`shaping_cost` for the three prompts, each in the three traffic patterns; then
    :func:`tools_cost`."""
    rows = [
        shaping_cost(lines, agent=agent, pattern=pattern)
        for lines, agent in ((40, False), (130, False), (556, True))
        for pattern in PATTERNS
    ]
    return [*rows, tools_cost()]


def _corpus_table(results: dict[str, Any]) -> bool:
    """Per cache model, session length and corpus template: cached share off / on (the
    default placement: after the newest turn, what the simulator's ``/tokenize`` accepts) /
    on with ``end_of_system`` / bound / reachable, TTFT p50, semantic check (both
    placements). Then the issue's done-when, template by template: whether any is worse than
    off in a placement, under 90 % of its reachable layout (agent and chat templates; the
    bound where no layout is written by hand) or changed a meaning. True when any failed."""
    print()
    print(
        "| cache model | sessions | template | kind | off | on | on (end of system) | bound | reachable "
        "| on / reachable | TTFT p50 off → on | semantic changes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    checks: dict[str, int] = {}
    failures: list[str] = []
    for cache_model, workloads in results["workloads"].items():
        for prefix, length in (("t:", "short"), ("l:", "long")):
            for template in corpus.TEMPLATES:
                rows = workloads.get(f"{prefix}{template.name}")
                if rows is None:
                    continue
                long = prefix == "l:"
                key = f"{length}:{template.name}"
                if key not in checks:
                    checks[key] = sum(
                        semantic_check(template, {"placement": placement, "rag": {"enabled": True}}, long)
                        for placement in ("after_last_turn", "end_of_system")
                    )
                share = {c: rows[c]["cached_share"] for c in RAG_CONFIGS if c in rows}
                reachable = share.get("reachable")
                target = reachable if reachable else share["ideal"]
                on_reach = share["on"] / target if target else 1.0
                where = f"{cache_model} {length} {template.name}"
                failures += [
                    f"{where}: {c} {100 * share[c]:.1f}% < off {100 * share['off']:.1f}%"
                    for c in ("on", "on-end")
                    if share[c] + 0.005 < share["off"]
                ]
                if template.kind in ("agent", "chat") and on_reach < 0.9:
                    failures.append(
                        f"{where}: on {100 * on_reach:.0f}% of {'reachable' if reachable else 'bound'}"
                    )
                if checks[key]:
                    failures.append(f"{where}: {checks[key]} shaped bodies changed meaning")
                reach = f"{100 * reachable:.1f}%" if reachable else "-"
                pct = {c: f"{100 * v:.1f}%" for c, v in share.items()}
                print(
                    f"| {cache_model} | {length} | {template.name} | {template.kind} | {pct['off']} "
                    f"| {pct['on']} | {pct['on-end']} | {pct['ideal']} "
                    f"| {reach} | {100 * on_reach:.0f}%{'' if reachable else ' (of bound)'} "
                    f"| {rows['off']['ttft_p50_ms']:.1f} → {rows['on']['ttft_p50_ms']:.1f} ms "
                    f"| {checks[key]} |"
                )
    print()
    print("Done-when failures:" if failures else "Done-when: every check passed.")
    for failure in failures:
        print(f"- {failure}")
    results["semantic_changes"] = checks
    results["done_when_failures"] = failures
    return bool(failures)


def _cost_ab(baseline: Path, rounds: int) -> int:
    """Shaping's cost, this checkout's gateway and ``baseline``'s, measured alternately (each
    in a process of its own, the same prompts), so both see the same machine load: per case
    the range of medians and of 99th percentiles over the rounds."""
    here = Path(__file__).resolve().parent.parent
    sides = {"baseline": baseline.resolve(), "this": here}
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, root in sides.items():
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, __file__, "--cost-only", "--json", out.name]
                command += ["--import-root", str(root)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                runs[name].append(json.loads(Path(out.name).read_text())["cost"])
    costs = runs["this"][0]
    cases = [
        f"{c['system_lines']} lines, {c['prompt_tokens']:,} tokens, {c.get('pattern', 'one conversation')}"
        for c in costs
    ]

    def span(name: str, case: int, key: str) -> str:
        values = [run[case][key] for run in runs[name]]
        low, high = round(min(values)), round(max(values))
        return f"{low} µs" if low == high else f"{low}-{high} µs"

    print(f"| system prompt, traffic | baseline ({baseline}) median | p99 | this checkout median | p99 |")
    print("|---|---|---|---|---|")
    for i, case in enumerate(cases):
        print(
            f"| {case} | {span('baseline', i, 'median_us')} | {span('baseline', i, 'p99_us')} "
            f"| {span('this', i, 'median_us')} | {span('this', i, 'p99_us')} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill-ms-per-1k", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--cost-only", action="store_true", help="only measure shaping's own cost")
    parser.add_argument("--no-corpus", dest="corpus", action="store_false", help="skip the template corpus")
    parser.add_argument("--corpus-only", action="store_true", help="only the template corpus")
    parser.add_argument(
        "--sessions",
        choices=("short", "long", "both"),
        default="both",
        help="the corpus sessions: short (vLLM's cache model only: under OpenAI's 1,024-token minimum), "
        "long (long answers and tool results; both cache models) or both",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="with --cost-only: measure this checkout's gateway and CHECKOUT's (e.g. an older commit's "
        "`git archive`) alternately, --rounds times each, and print both",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each side for --baseline")
    parser.add_argument("--import-root", help=argparse.SUPPRESS)  # read before the imports, above
    args = parser.parse_args()
    if args.baseline:
        return _cost_ab(Path(args.baseline), args.rounds)
    results: dict[str, Any] = {}
    if not args.cost_only:
        results["workloads"] = run_matrix(args)
    results["cost"] = costs = [] if args.corpus_only else shaping_costs()
    failed = False
    if not args.cost_only:
        print(
            "| cache model | workload | off | on | on (end of system) | ideal | on / ideal "
            "| TTFT p50 off → on |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for cache_model, workloads in results["workloads"].items():
            for name, rows in workloads.items():
                if ":" in name:  # a corpus template's row (its own table below)
                    continue
                share = {c: rows[c]["cached_share"] for c in CONFIGS}
                ratio = share["on"] / share["ideal"] if share["ideal"] else 1.0
                failed |= ratio < 0.9
                print(
                    f"| {cache_model} | {name} | {100 * share['off']:.1f}% | {100 * share['on']:.1f}% | "
                    f"{100 * share['on-end']:.1f}% | {100 * share['ideal']:.1f}% | {100 * ratio:.0f}% | "
                    f"{rows['off']['ttft_p50_ms']:.1f} → {rows['on']['ttft_p50_ms']:.1f} ms |"
                )
    if not args.cost_only and args.corpus:
        failed |= _corpus_table(results)
    for cost in costs:
        print(
            f"shaping cost, {cost['prompt_tokens']:,}-token prompt, {cost['system_lines']} system lines "
            f"({cost['system']}), {cost['pattern']}: "
            f"median {cost['median_us']:.0f} µs, p99 {cost['p99_us']:.0f} µs"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
