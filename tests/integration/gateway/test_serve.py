"""`switchyard serve` as a user runs it: zero-config defaults, workers, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from gateway.procutil import free_port, wait_http_ok
from tests.helpers import ROOT


def children_of(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().split()
    return stat[2] != "Z"


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_") and k != "REDIS_URL"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", *args],
            env={**clean, "SWITCHYARD_PORT": str(port), **(env or {})},
            stdout=open(tmp_path / f"serve-{port}.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", 30, proc)
        return proc, url

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_zero_config_serves_the_simulator_with_an_embedded_redis(serve: object) -> None:
    proc, url = serve()  # type: ignore[operator]
    client = openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0)
    reply = client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "sim-fast" and reply.choices[0].message.content
    assert {m.id for m in client.models.list()} >= {"sim-fast", "sim-strong", "fast", "strong", "auto"}
    with urllib.request.urlopen(url + "/readyz") as resp:
        ready = json.loads(resp.read())
    assert ready["redis"] is True
    assert ready["policy"]["source"].endswith("embedded_policy.yaml")
    # Stats reach the embedded Redis.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/admin/stats?since=5m") as resp:
            stats = json.loads(resp.read())
        if stats["deployments"].get("sim-fast", {}).get("requests") == 1:
            break
        time.sleep(0.1)
    assert stats["deployments"]["sim-fast"]["requests"] == 1
    assert stats["deployments"]["sim-fast"]["prompt_tokens"] > 0

    kids = children_of(proc.pid)
    assert len(kids) == 2  # redis-server and the simulator
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    time.sleep(0.2)
    assert not any(alive(k) for k in kids), "embedded Redis and simulator stop with the gateway"


def test_workers_share_the_port(serve: object, redis_url: str) -> None:
    proc, url = serve("--workers", "2", "--redis-url", redis_url)  # type: ignore[operator]
    pids = set()
    deadline = time.monotonic() + 20
    while len(pids) < 2 and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                pids.add(json.loads(resp.read())["pid"])
        except OSError:
            time.sleep(0.05)
    assert len(pids) == 2
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    for _ in range(6):
        assert client.chat.completions.create(
            model="strong", messages=[{"role": "user", "content": "x"}]
        ).choices
    redis.Redis.from_url(redis_url).ping()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not any(alive(p) for p in pids)


def test_bad_policy_refuses_to_start_with_the_error_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  a: {base_url: 'http://x'}\ntiers:\n  fast: [b]\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1
    assert f"{bad}:4: tiers.fast[0]: unknown deployment 'b'" in out.stderr


def test_the_cache_example_serves_repeats_from_the_cache_in_one_command(serve: object) -> None:
    _, url = serve("--policy", "policies/examples/cache.yaml")  # type: ignore[operator]
    client = openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0)
    ask = [{"role": "user", "content": "What is a response cache?"}]
    outcomes = []
    deadline = time.monotonic() + 10
    while "hit" not in outcomes:
        assert time.monotonic() < deadline, outcomes
        raw = client.chat.completions.with_raw_response.create(model="fast", messages=ask, temperature=0)  # type: ignore[arg-type]
        outcomes.append(raw.headers["x-switchyard-cache"])
    assert outcomes[0] == "store"
