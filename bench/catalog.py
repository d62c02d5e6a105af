"""The benchmark scenarios ``python -m bench`` runs: a name, the script it runs, and one line
on what it measures. Adding a scenario is one entry here (and its section in bench/README.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Scenario:
    """One benchmark: ``script`` is relative to ``bench/`` and gets the arguments unchanged."""

    name: str
    script: str
    measures: str

    @property
    def path(self) -> Path:
        """The script's absolute path."""
        return BENCH_DIR / self.script


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "overhead",
        "overhead.sh",
        "the gateway's own cost: wrk through it and straight at a canned nginx upstream, in one run "
        "(--full, --floor, --peers, --litellm, --cache, --workers N, --hold N add targets)",
    ),
    Scenario(
        "shaping",
        "shaping.py",
        "prompt shaping: three workloads replayed to the simulator, cached-token share and TTFT "
        "with shaping off / on / ideal, and shaping's own cost per request",
    ),
    Scenario(
        "faults",
        "faults.py",
        "dispatch under faults: hedging against a deployment that hangs, fallback through an "
        "outage; `faults load`: hung upstreams under 32 clients",
    ),
    Scenario(
        "soak",
        "soak.py",
        "a keyed gateway under load and faults: 60 s of wrk, 1,000 held streams, Redis killed "
        "and the policy broken mid-load; no failed request, no memory or descriptor growth",
    ),
    Scenario(
        "hold",
        "hold.py",
        "N SSE streams held open at once through one target: completions, time to first byte, "
        "peak RSS (overhead --hold runs it through every target)",
    ),
    Scenario(
        "floor",
        "floor.py",
        "the floor of a Python hop as a server to load by hand: aiohttp's or a bare Protocol "
        "with the gateway's upstream client (overhead --floor runs both)",
    ),
    Scenario(
        "routing-features",
        "routing_features.py",
        "the router's cost per request, in process: feature extraction and the whole decision "
        "(linear, ngram; --tools, --choices, --embedding)",
    ),
    Scenario(
        "agent-request",
        "agent_request.py",
        "each step of preparing an agent's request (limits, validation, shaping, routing), "
        "in process, for a body with tools and tool calls",
    ),
    Scenario(
        "anthropic-breakpoints",
        "anthropic_breakpoints.py",
        "Anthropic cache breakpoints placed by the client, nowhere or by the gateway, on chat, "
        "agent and RAG workloads against the simulator's Messages API: cache reads and cost",
    ),
    Scenario(
        "prefix-replay",
        "prefix_replay.py",
        "a chat workload with a volatile date line against a running gateway and vLLM: vLLM's "
        "own prefix-cache hit rate and TTFT (local_backend/vllm/gpu_check.sh runs it)",
    ),
    Scenario(
        "response-cache",
        "response_cache.py",
        "the response cache: the CPU a miss adds (key, store check, the Redis lookup, the semantic "
        "lookup), and p50 and req/s at concurrency 1 for direct, cache off, miss and hit",
    ),
)

BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}

ELSEWHERE = (
    ("switchyard bench run|compare", "a latency regression suite against a running gateway "
     "(gateway/tools/bench.py; docs/benchmarks.md)"),
    ("bench/probes/", "one-off measurements behind a recorded decision (bench/probes/README.md)"),
)  # fmt: skip


def listing() -> str:
    """The scenarios, one line each, then the benchmarks that live elsewhere."""
    width = max(len(s.name) for s in SCENARIOS)
    lines = ["python -m bench SCENARIO [ARGS...]   (ARGS go to the scenario's script unchanged)", ""]
    lines += [f"  {s.name:<{width}}  {s.measures}" for s in SCENARIOS]
    lines += ["", "  report-results    regenerate bench/README.md's results from bench/recorded/ (--check: "
              "exit 1 if it is stale)", "", "Elsewhere:"]  # fmt: skip
    lines += [f"  {name}  {what}" for name, what in ELSEWHERE]
    return "\n".join(lines)
