"""``switchyard local serve`` runs a real vLLM (CPU build, tiny model); a gateway routes to it
through ``replicas: {urls: ...}``. A SIGKILL of vLLM's API server is seen at once and the
server restarted, the gateway answering 503 ``upstream_unavailable`` meanwhile; SIGTERM drains
the request in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.procutil import free_port
from tests.helpers import ROOT, GatewayProcess, readyz
from tests.vllm.conftest import RealVllm, start_gateway

# vLLM starts in tens of seconds, minutes on a busy 2-core machine.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


class LocalServe:
    """``switchyard local serve CONFIG`` as a child process, its JSON log in a file."""

    def __init__(self, real: RealVllm, workdir: Path) -> None:
        self.port = free_port()
        self.config = workdir / "local-serve.yaml"
        self.config.write_text(real.launch_yaml(port=self.port, served_model_name="tiny"))
        self.log_path = workdir / "local-serve.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "local", "serve", str(self.config), "--name", "tiny"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **real.env},
        )  # fmt: skip

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") == name:
                    out.append(entry)
        return out

    def wait_event(self, name: str, count: int = 1, timeout_s: float = 400) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.events(name)) < count:
            assert self.proc.poll() is None, self.log_path.read_text()[-4000:]
            assert not self.events("vllm_gave_up"), self.log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, self.log_path.read_text()[-4000:]
            time.sleep(0.05)
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def stamp(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def served(real_vllm: RealVllm, workdir: Path) -> Iterator[LocalServe]:
    serve = LocalServe(real_vllm, workdir)
    try:
        serve.wait_event("vllm_ready")
        yield serve
    finally:
        serve.stop()


@pytest.fixture(scope="module")
def gateway(
    served: LocalServe, real_vllm: RealVllm, module_redis: str, workdir: Path
) -> Iterator[GatewayProcess]:
    policy = f"""
deployments:
  tiny:
    provider: vllm
    replicas: {{urls: ["{served.base_url}"], health_interval_s: 0.2, metrics_interval_s: 0.5}}
tiers: {{fast: [tiny]}}
"""
    gw = start_gateway(policy, module_redis, workdir, real_vllm)
    try:
        yield gw
    finally:
        gw.stop()


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)


def ready(gw: GatewayProcess, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while not readyz(gw.url)["replicas"]["tiny"]["ready"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_local_serve_starts_vllm_and_the_gateway_routes_to_it(
    served: LocalServe, gateway: GatewayProcess
) -> None:
    ready(gateway)
    preflight = served.events("vllm_preflight_ok")[0]
    assert preflight["version"].startswith("0.") and preflight["platform"] == "cpu"
    command = served.events("vllm_starting")[0]["command"]
    assert "VLLM_CPU_KVCACHE_SPACE=1" in command and "--shutdown-timeout 30" in command
    ready_s = served.events("vllm_ready")[0]["startup_s"]
    print(f"vLLM ready {ready_s} s after its start")
    with client(gateway) as c:
        reply = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert reply.choices[0].message.content is not None


def test_a_killed_api_server_is_seen_at_once_and_restarted_with_503_meanwhile(
    served: LocalServe, gateway: GatewayProcess
) -> None:
    ready(gateway)
    pid = served.events("vllm_starting")[-1]["pid"]
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    exited = served.wait_event("vllm_exited", timeout_s=30)[-1]
    detected_s = stamp(exited) - killed_at
    print(f"exit of the API server seen after {detected_s:.3f} s")
    assert detected_s < 1.0
    time.sleep(0.5)  # the gateway's health check (every 0.2 s) takes the replica out
    started = time.monotonic()
    with client(gateway) as c, pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert time.monotonic() - started < 5  # refused, not hung
    assert info.value.status_code == 503 and info.value.code == "upstream_unavailable"
    served.wait_event("vllm_ready", count=2)
    ready(gateway)
    with client(gateway) as c:
        reply = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert reply.choices[0].message.content is not None
    assert served.events("vllm_restarting")[-1]["reason"] == "exited"


def test_sigterm_drains_the_request_in_flight(served: LocalServe, gateway: GatewayProcess) -> None:
    ready(gateway)
    result: dict[str, Any] = {}

    def long_stream() -> None:
        try:
            with client(gateway) as c:
                stream = c.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "Tell a long story."}],
                    max_tokens=400,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                for chunk in stream:
                    result.setdefault("first_at", time.monotonic())
                    if chunk.usage is not None:
                        result["usage"] = chunk.usage
                    if chunk.choices and chunk.choices[0].finish_reason:
                        result["finish_reason"] = chunk.choices[0].finish_reason
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=long_stream)
    thread.start()
    deadline = time.monotonic() + 60
    while "first_at" not in result and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    served.proc.send_signal(signal.SIGTERM)
    thread.join(120)
    assert "error" not in result, result
    assert result["finish_reason"] == "length" and result["usage"].completion_tokens == 400
    assert served.proc.wait(60) == 0
    assert served.events("vllm_stopped")
