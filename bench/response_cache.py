"""What the response cache costs and saves (issue #55).

    .venv/bin/python bench/response_cache.py [--runs 2000] [--requests 400] [--no-http]

1. In process (no HTTP): the CPU a cache miss adds over the cache off, per request: the
   plan and key (canonical JSON, SHA-256 and blake2b), the Redis ``GET`` (the cache's own RESP
   client, and redis-py through the gate for comparison, against a real redis-server
   child), the store's work (the answer parsed and checked, the entry encoded), and a
   whole miss (plan, ``GET``, store's ``SET``) through ``ResponseCache`` at concurrency 1
   and 16. For the overhead benchmark's chat turn and for an agent's request
   (``bench/agent_request.py``).
2. Over HTTP at concurrency 1 (one keep-alive connection, ``http.client``): the same
   request straight at the simulator (no latency, ``m:0:0``), through a gateway with the
   cache off, and through one with the cache on, as a miss that stores (``Cache-Control:
   no-cache``: the lookup skipped, the answer stored again) and as a hit. Prints p50 per request and
   requests per second. The simulator is not the overhead benchmark's nginx: it costs more
   per answer, so a hit's lead over a miss is larger against a real upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from agent_request import agent_body

from gateway.cache.entry import Entry
from gateway.cache.key import plan_request, settle
from gateway.cache.policy import CachePolicy, missing_extra
from gateway.cache.service import ResponseCache, keep_answer, storable
from gateway.context import RequestContext
from gateway.procutil import free_port, run_async, wait_http_ok
from gateway.store import connect
from gateway.store.embedded import EmbeddedRedis
from gateway.store.gate import RedisGate
from gateway.store.resp import fast_client

ROOT = Path(__file__).resolve().parent.parent
CHAT = {
    "model": "fast",
    "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
    "temperature": 0,
}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there! " * 20},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 60, "total_tokens": 80},
    }
)


def _cpu_us(fn: Any, runs: int) -> float:
    """Process CPU microseconds per call, best of three rounds."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(runs):
            fn()
        best = min(best, (time.process_time() - t0) / runs)
    return best * 1e6


async def _redis_get_us(url: str, runs: int, how: str) -> float:
    redis = connect(url)
    gate = RedisGate(1.0)  # the client's CPU, not the bound: a loaded machine must not trip it
    fast = fast_client(url, gate)
    assert fast is not None
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(runs):
            if how == "resp":
                await fast.get("bench:rc:missing")
            elif how == "gated":
                await gate.call(lambda: redis.get("bench:rc:missing"))
            else:
                await redis.get("bench:rc:missing")
        best = min(best, (time.process_time() - t0) / runs)
    fast.close()
    await redis.aclose()
    return best * 1e6


async def _miss_us(url: str, runs: int, concurrency: int, resp: bool) -> float:
    """CPU per miss through :class:`ResponseCache`: plan and key, the lookup, the store."""
    redis = connect(url)
    # A bound a loaded machine never trips: a timeout would skip Redis and look cheap.
    gate = RedisGate(1.0)
    cache = ResponseCache(redis, gate, fast_client(url, gate) if resp else None)
    policy = CachePolicy(enabled=True)
    ctx: Any = RequestContext.__new__(RequestContext)
    ctx.escalated, ctx.deployment, ctx.usage, ctx.key_id = None, "sim-fast", None, "k"
    answer = orjson.loads(ANSWER)
    serial = iter(range(10**9))
    run = f"{concurrency}-{resp}-{time.time_ns()}"  # every prompt new: a miss

    async def misses(count: int) -> None:
        for _ in range(count):
            body = {**CHAT, "messages": [{"role": "user", "content": f"Say hello {run} {next(serial)}."}]}
            plan = plan_request(policy, "/chat/completions", body, {}, "k", None)
            assert plan is not None and settle(plan, policy, "fast", "sim-fast", "m") is not None
            assert await cache.lookup(plan) is None
            keep_answer(cache, plan, ctx, body, answer, ANSWER, policy, None)

    await misses(200)  # connected, warm
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        await asyncio.gather(*(misses(runs // concurrency) for _ in range(concurrency)))
        await cache.drain()
        best = min(best, (time.process_time() - t0) / (runs // concurrency * concurrency))
    assert not gate.failed_calls, "Redis timed out: the figures would not be a miss's"
    cache.close()
    await redis.aclose()
    return best * 1e6


def _semantic(runs: int) -> dict[str, float]:
    """The semantic lookup's CPU: the turn's embedding and a search of 1,000 stored turns."""
    import faiss
    import numpy as np

    from gateway.routing.static_embedder import load

    embedder = load()
    turns = [f"How do I do task number {i} with a list in Python?" for i in range(1000)]
    index = faiss.IndexHNSWFlat(embedder.dimensions, 16, faiss.METRIC_INNER_PRODUCT)
    index.add(np.stack([embedder.embed(t) for t in turns]).astype(np.float32))
    query = np.asarray(embedder.embed("How can I reverse a Python list?"), dtype=np.float32).reshape(1, -1)
    return {
        "semantic: embed the last user turn": _cpu_us(
            lambda: embedder.embed("How can I reverse a Python list?"), runs
        ),
        "semantic: search 1,000 stored turns (faiss HNSW)": _cpu_us(lambda: index.search(query, 1), runs),
    }


def in_process(runs: int) -> dict[str, float]:
    policy = CachePolicy(enabled=True)
    agent = {**orjson.loads(agent_body(20, 4)), "temperature": 0}
    bodies = {"chat turn": CHAT, "agent (20 tools, 4 steps)": agent}
    out: dict[str, float] = {}
    for name, body in bodies.items():
        tools = body.get("tools")
        tools_json = orjson.dumps(tools) if tools else None  # the size check's, in the gateway

        def key(body: dict[str, Any] = body, tools_json: bytes | None = tools_json) -> None:
            plan = plan_request(policy, "/chat/completions", body, {}, "0123456789ab", None, tools_json)
            assert plan is not None
            settle(plan, policy, "fast", "sim-fast", "gpt-4.1-mini")

        out[f"plan + key, {name}"] = _cpu_us(key, runs)
    plan = plan_request(policy, "/chat/completions", CHAT, {}, "k", None)
    assert plan is not None
    settle(plan, policy, "fast", "sim-fast", "m")
    ctx: Any = RequestContext.__new__(RequestContext)
    ctx.escalated, ctx.deployment, ctx.usage, ctx.key_id = None, "sim-fast", None, "k"

    def store() -> None:
        answer = orjson.loads(ANSWER)
        if storable(plan, ctx, answer, False):
            Entry("chat", ANSWER, answer.get("usage"), "sim-fast", time.time(), "k").encode()

    out["store's checks + encode (chat answer)"] = _cpu_us(store, runs)
    if missing_extra() is None:
        out.update(_semantic(runs))
    with EmbeddedRedis() as server:
        url = server.url
        out["Redis GET, the cache's RESP client (client CPU)"] = run_async(_redis_get_us(url, runs, "resp"))
        out["Redis GET, redis-py alone (client CPU)"] = run_async(_redis_get_us(url, runs, "redis-py"))
        out["Redis GET, redis-py through the gate"] = run_async(_redis_get_us(url, runs, "gated"))
        for conc in (1, 16):
            for resp, client in ((True, "RESP client"), (False, "redis-py")):
                out[f"a whole miss, c={conc}, {client}"] = run_async(_miss_us(url, runs, conc, resp))
    return out


def _timed(port: int, body: bytes, headers: dict[str, str], count: int, path: str) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    took = []
    for _ in range(count):
        t0 = time.perf_counter()
        conn.request("POST", path, body, {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        took.append(time.perf_counter() - t0)
    conn.close()
    return took


def over_http(requests: int) -> dict[str, tuple[float, float]]:
    tmp = Path(tempfile.mkdtemp())
    sim_port, procs = free_port(), []
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "local_backend.sim", "--port", str(sim_port), "--model", "m:0:0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
    )
    wait_http_ok(f"http://127.0.0.1:{sim_port}/health", 20, procs[0])
    ports = {}
    with EmbeddedRedis() as redis_server:
        for name, extra in (("off", ""), ("on", "cache: {enabled: true}\n")):
            policy = tmp / f"{name}.yaml"
            policy.write_text(
                f'deployments:\n  m: {{provider: vllm, base_url: "http://127.0.0.1:{sim_port}/v1"}}\n'
                f"tiers:\n  fast: [m]\n{extra}"
            )
            port = ports[name] = free_port()
            cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--policy", str(policy)]
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - the process keeps it
            procs.append(
                subprocess.Popen(
                    [*cmd, "--redis-url", redis_server.url],
                    cwd=ROOT,
                    env={**env, "SWITCHYARD_LOG_LEVEL": "warning"},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", 30, procs[-1])
        body = orjson.dumps(CHAT)
        cases = {
            "direct to the simulator": (
                sim_port,
                {},
                "/v1/chat/completions",
                orjson.dumps({**CHAT, "model": "m"}),
            ),
            "gateway, cache off": (ports["off"], {}, "/v1/chat/completions", body),
            "gateway, cache miss (+ store)": (
                ports["on"],
                {"Cache-Control": "no-cache"},
                "/v1/chat/completions",
                body,
            ),
            "gateway, cache hit": (ports["on"], {}, "/v1/chat/completions", body),
        }
        took: dict[str, list[float]] = {name: [] for name in cases}
        rounds = 8
        try:
            # Interleaved rounds (the first one a warm-up): the machine's load drifts over
            # a run, and every case should see the same drift.
            for r in range(rounds + 1):
                for name, (port, headers, path, data) in cases.items():
                    got = _timed(port, data, headers, max(1, requests // rounds), path)
                    if r:
                        took[name] += got
            out = {n: (statistics.median(t) * 1000, len(t) / sum(t)) for n, t in took.items()}
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--no-http", action="store_true", help="only the in-process part")
    args = parser.parse_args()
    print("CPU a miss adds, in process (us per request, best of 3):")
    for name, us in in_process(args.runs).items():
        print(f"  {name:<50} {us:8.1f}")
    if args.no_http:
        return
    print(f"\nOver HTTP, concurrency 1, {args.requests} requests each (p50 ms, req/s):")
    for name, (p50, rps) in over_http(args.requests).items():
        print(f"  {name:<45} {p50:8.3f} {rps:9.0f}")


if __name__ == "__main__":
    main()
