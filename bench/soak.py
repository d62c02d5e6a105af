"""Soak and fault run: wrk load through a keyed gateway, with Redis and the policy broken mid-load.

Phases (each one's figures are printed, and written as JSON with --out):

1. ``load``: ``--seconds`` (60) of wrk, non-stream and stream at once. Zero unexpected
   errors; the gateway's RSS growth after a warm-up (first 10 s) under 20 MB; its open file
   descriptors back to the post-warm-up baseline once the load stops (waiting up to 70 s:
   idle keep-alive connections to the upstream close after 60 s).
2. ``streams``: ``--streams`` (1,000) concurrent SSE streams of a slow model, held open
   together and all completed with ``[DONE]``.
3. ``redis``: 30 s of load; Redis is killed (SIGKILL) at 8 s and restarted at 18 s. No request
   may fail; the stats writes dropped meanwhile are counted; stats are written again after.
4. ``policy``: 20 s of load; the policy file is replaced with garbage at 5 s and restored at
   15 s. No request may fail; ``/readyz`` shows the reload error meanwhile.

Every request carries a virtual key with RPM/TPM limits far above the load, so key checks
and the Lua rate limiter are on the path throughout.

    python bench/soak.py [--seconds 60] [--streams 1000] [--out soak.json]

Needs ``wrk`` and ``redis-server`` on PATH. Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from gateway.procutil import free_port, serving

ROOT = Path(__file__).resolve().parent.parent
WRK = ROOT / "bench" / "wrk"
ADMIN_KEY = "soak-admin-key-5b1d"
WARMUP_S = 10.0


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int, ports: dict[int, str]) -> dict[str, int]:
    """The process's descriptors by kind: TCP connections named by the peer's port
    (``ports``: port -> name), listening sockets, other sockets, files and pipes."""
    peers: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if cols[3] == "0A":
                peers[cols[9]] = "listening"
            elif remote_port in ports:
                peers[cols[9]] = "to " + ports[remote_port]
            elif local_port in ports:
                peers[cols[9]] = "from clients to " + ports[local_port]
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            kind = peers.get(target[8:-1], "other socket")
        elif target.startswith(("pipe:", "anon_inode:")):
            kind = target.split(":")[0]
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


class Redis:
    """A redis-server on a TCP port that can be killed and restarted on the same port."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            # Persistent, as a production Redis is: the keys must survive the kill.
            [
                *("redis-server", "--port", str(self.port), "--save", "", "--appendonly", "yes"),
                *("--appendfsync", "always", "--dir", str(self.data_dir)),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import socket

                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def http(method: str, url: str, body: Any = None, key: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def wrk(url: str, key: str, seconds: float, stream: bool, connections: int) -> subprocess.Popen[bytes]:
    script = WRK / ("chat_stream.lua" if stream else "chat.lua")
    env = {
        **os.environ,
        "BENCH_MODEL": "fast",
        "BENCH_API_KEY": key,
        "BENCH_LABEL": "stream" if stream else "unary",
    }
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--timeout", "10s", "-s", str(script), url]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def wrk_result(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    for line in out.decode().splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line[len("BENCH_RESULT ") :])
            return result
    raise RuntimeError("wrk printed no result:\n" + out.decode())


def load(url: str, key: str, seconds: float) -> list[subprocess.Popen[bytes]]:
    return [wrk(url, key, seconds, False, 32), wrk(url, key, seconds, True, 16)]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        r["label"]: {
            "requests": r["requests"],
            "rps": r["rps"],
            "errors": r["errors"],
            "errors_detail": r["errors_detail"],
            "p50_ms": float(r["latency_ms"]["p50"]),
            "p99_ms": float(r["latency_ms"]["p99"]),
        }
        for r in results
    }


def phase_load(gw: str, pid: int, key: str, seconds: float, ports: dict[int, str]) -> dict[str, Any]:
    # Warm-up at the same concurrency, so the pools and caches exist before the baseline.
    for proc in load(gw + "/v1/chat/completions", key, 5):
        wrk_result(proc)
    time.sleep(2)
    fds_before = open_fds(pid)
    kinds_before = fd_kinds(pid, ports)
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            samples.append((time.monotonic() - t0, rss_mb(pid)))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = [wrk_result(p) for p in load(gw + "/v1/chat/completions", key, seconds)]
    stop.set()
    sampler.join()
    time.sleep(3)
    fds_after_3s = open_fds(pid)
    t_idle = time.monotonic()
    while open_fds(pid) > fds_before and time.monotonic() - t_idle < 70:
        time.sleep(1)
    fds_after = open_fds(pid)
    kinds_after = fd_kinds(pid, ports)
    after_warmup = [rss for t, rss in samples if t >= WARMUP_S]
    rss_warm = after_warmup[0] if after_warmup else samples[0][1]
    rss_end = samples[-1][1]
    errors = sum(r["errors"] for r in results)
    growth = rss_end - rss_warm
    return {
        "wrk": summarize(results),
        "errors": errors,
        "rss_mb": {
            "start": samples[0][1],
            "after_warmup": rss_warm,
            "end": rss_end,
            "max": max(s[1] for s in samples),
        },
        "rss_growth_mb": round(growth, 2),
        "fds": {
            "before": fds_before,
            "after_3s": fds_after_3s,
            "after": fds_after,
            "waited_s": round(time.monotonic() - t_idle + 3, 1),
            "kinds_before": kinds_before,
            "kinds_after": kinds_after,
        },
        # Pools (upstream keep-alive, Redis) may end a little above their warm-up high-water
        # mark; a leak would be one descriptor per request or stream, thousands here.
        "ok": errors == 0 and growth < 20 and fds_after <= fds_before + 16,
    }


async def _streams(url: str, key: str, count: int) -> dict[str, Any]:
    body = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": "Tell me a story."}]}
    headers = {"Authorization": f"Bearer {key}"}
    opened: list[float] = []
    closed: list[float] = []
    failures: list[str] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> None:
            try:
                async with session.post(url, json=body, headers=headers) as resp:
                    if resp.status != 200:
                        failures.append(f"status {resp.status}")
                        return
                    first = True
                    data = b""
                    async for chunk in resp.content.iter_any():
                        if first:
                            opened.append(time.monotonic())
                            first = False
                        data += chunk
                    if not data.rstrip().endswith(b"data: [DONE]"):
                        failures.append("incomplete")
                        return
                    closed.append(time.monotonic())
            except Exception as exc:
                failures.append(type(exc).__name__)

        t0 = time.monotonic()
        await asyncio.gather(*(one() for _ in range(count)))
        elapsed = time.monotonic() - t0
    # Streams open at once: every first chunk arrived before the first stream ended.
    held = sum(1 for t in opened if not closed or t <= min(closed))
    return {
        "streams": count,
        "completed": len(closed),
        "failures": len(failures),
        "failure_kinds": sorted(set(failures)),
        "open_together": held,
        "elapsed_s": round(elapsed, 2),
        "ok": len(closed) == count and held == count,
    }


def phase_streams(gw: str, key: str, count: int) -> dict[str, Any]:
    return asyncio.run(_streams(gw + "/v1/chat/completions", key, count))


def phase_redis(gw: str, key: str, redis: Redis, log: Path) -> dict[str, Any]:
    before = http("GET", gw + "/admin/stats?since=5m", key=ADMIN_KEY)["stats_writes"]
    procs = load(gw + "/v1/chat/completions", key, 30)
    time.sleep(8)
    redis.kill()
    time.sleep(2)
    ready_down = http("GET", gw + "/readyz")
    time.sleep(8)
    redis.start()
    t_up = time.monotonic()
    # Until the gateway reads stats from the restarted Redis again.
    while True:
        try:
            at_restart = http("GET", gw + "/admin/stats?since=1m", key=ADMIN_KEY)["stats_writes"]
            break
        except urllib.error.HTTPError:
            if time.monotonic() - t_up > 10:
                raise
            time.sleep(0.2)
    stats_back_s = time.monotonic() - t_up
    results = [wrk_result(p) for p in procs]
    time.sleep(1)
    after = http("GET", gw + "/admin/stats?since=1m", key=ADMIN_KEY)
    writes = after["stats_writes"]
    recovered_s = time.monotonic() - t_up
    lines = log.read_text().splitlines()
    errors = sum(r["errors"] for r in results)
    return {
        "wrk": summarize(results),
        "errors": errors,
        "readyz_redis_while_down": ready_down["redis"],
        "stats_dropped": writes["dropped"] - before["dropped"],
        "stats_dropped_after_restart": writes["dropped"] - at_restart["dropped"],
        "stats_written_after_restart": writes["written"] - at_restart["written"],
        "stats_readable_after_restart_s": round(stats_back_s, 2),
        "seconds_after_restart": round(recovered_s, 1),
        "rate_limit_unavailable_logged": any("rate_limit_unavailable" in line for line in lines),
        "ok": errors == 0
        and writes["dropped"] > before["dropped"]
        and writes["written"] > at_restart["written"]
        and ready_down["redis"] is False,
    }


def phase_policy(gw: str, key: str, policy: Path) -> dict[str, Any]:
    good = policy.read_text()
    procs = load(gw + "/v1/chat/completions", key, 20)
    time.sleep(5)
    policy.write_text("deployments: [this is {not: a policy\n\x00garbage")
    time.sleep(2)
    error = http("GET", gw + "/readyz")["policy"]["reload_error"]
    time.sleep(8)
    policy.write_text(good)
    results = [wrk_result(p) for p in procs]
    recovered = http("GET", gw + "/readyz")["policy"]["reload_error"]
    errors = sum(r["errors"] for r in results)
    return {
        "wrk": summarize(results),
        "errors": errors,
        "reload_error_while_garbage": error,
        "reload_error_after_restore": recovered,
        "ok": errors == 0 and bool(error) and recovered is None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the load phase")
    parser.add_argument("--streams", type=int, default=1000, help="concurrent SSE streams")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--log", help="copy the gateway's log here at the end")
    parser.add_argument("--log-level", default="warning", help="the gateway's SWITCHYARD_LOG_LEVEL")
    parser.add_argument(
        "--phases", default="load,streams,redis,policy", help="comma-separated subset of the phases to run"
    )
    args = parser.parse_args()
    _raise_fd_limit()
    phases = set(args.phases.split(","))
    report: dict[str, Any] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="switchyard-soak-") as tmp:
        work = Path(tmp)
        redis = Redis(work)
        redis.start()
        stack.callback(redis.kill)
        sim_port = free_port()
        sim_cmd = [
            sys.executable,
            "-m",
            "local_backend.sim",
            "--port",
            str(sim_port),
            "--max-num-seqs",
            "4096",
        ]
        # slow: about 8 s a stream, so all of them are open at once on a small machine.
        sim_cmd += ["--model", "sim-fast:5:1", "--model", "slow:200:400", "--output-tokens", "16:24"]
        stack.enter_context(
            serving(sim_cmd, f"http://127.0.0.1:{sim_port}/health", log=work / "sim.log", cwd=ROOT)
        )
        base = f"http://127.0.0.1:{sim_port}/v1"
        policy = work / "policy.yaml"
        policy.write_text(
            "deployments:\n"
            f'  sim-fast: {{provider: vllm, base_url: "{base}", max_connections: 2048,'
            " price: {input: 0.4, cached_input: 0.1, output: 1.6}}\n"
            f'  slow: {{provider: vllm, base_url: "{base}", max_connections: 2048}}\n'
            "tiers: {fast: [sim-fast]}\n"
        )
        gw_port = free_port()
        gw_log = work / "gateway.log"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")},
            "SWITCHYARD_AUTH": "keys",
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_LOG_LEVEL": args.log_level,
        }
        gw_cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(gw_port), "--policy", str(policy)]
        gw_cmd += ["--redis-url", redis.url]
        gw = f"http://127.0.0.1:{gw_port}"
        pid = stack.enter_context(
            serving(gw_cmd, gw + "/healthz", log=gw_log, env=env, cwd=ROOT, stop_timeout_s=40)
        ).pid
        ports = {redis.port: "redis", sim_port: "simulator", gw_port: "gateway"}
        key = http("POST", gw + "/admin/keys", {"name": "soak", "rpm": 10**8, "tpm": 10**11}, key=ADMIN_KEY)[
            "key"
        ]
        for name, run in (
            ("load", lambda: phase_load(gw, pid, key, args.seconds, ports)),
            ("streams", lambda: phase_streams(gw, key, args.streams)),
            ("redis", lambda: phase_redis(gw, key, redis, gw_log)),
            ("policy", lambda: phase_policy(gw, key, policy)),
        ):
            if name not in phases:
                continue
            print(f"--- {name}", flush=True)
            report[name] = run()
            print(json.dumps(report[name], indent=2), flush=True)
        report["gateway_rss_mb_final"] = rss_mb(pid)
        report["gateway_log_tracebacks"] = gw_log.read_text().count("Traceback")
        if args.log:
            Path(args.log).write_text(gw_log.read_text())
    ok = all(phase.get("ok") for phase in report.values() if isinstance(phase, dict))
    report["ok"] = ok and report["gateway_log_tracebacks"] == 0
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("ALL OK" if report["ok"] else "SOME CHECKS FAILED", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
