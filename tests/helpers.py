"""Real processes for tests: the simulator and the gateway, each on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from gateway.procutil import free_port, wait_http_ok

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIR = ROOT / "test-output"


def http_json(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def readyz(base_url: str) -> Any:
    """The gateway's ``/readyz`` body, whether it answered 200 (ready) or 503 (not yet)."""
    try:
        return http_json("GET", base_url + "/readyz")
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise
        return json.loads(exc.read() or b"null")


class SimServer:
    """``python -m local_backend.sim`` with the given arguments."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> SimServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "local_backend.sim", "--port", str(self.port), *self.args],
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )
        wait_http_ok(self.url + "/health", 20, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    def stats(self) -> Any:
        return http_json("GET", self.url + "/sim/stats")

    def reset(self) -> None:
        http_json("POST", self.url + "/sim/reset", {})

    def set_fault(self, model: str, fault: str, rate: float = 1.0, count: int | None = None) -> None:
        http_json(
            "POST", self.url + "/sim/faults", {"model": model, "fault": fault, "rate": rate, "count": count}
        )

    def clear_faults(self) -> None:
        http_json("DELETE", self.url + "/sim/faults")


class GatewayProcess:
    """``switchyard serve`` as a child process with a policy written to a file."""

    def __init__(
        self,
        policy: str | None,
        *,
        redis_url: str | None,
        workdir: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        flush_redis: bool = True,
    ) -> None:
        self.port = free_port()
        self.policy_path: Path | None = None
        if policy is not None:
            self.policy_path = workdir / f"policy-{self.port}.yaml"
            self.policy_path.write_text(policy)
        self.redis_url = redis_url
        self.env = env or {}
        self.args = args or []
        self.flush_redis = flush_redis
        self.log_path = workdir / f"gateway-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> GatewayProcess:
        if self.redis_url and self.flush_redis:
            redis.Redis.from_url(self.redis_url).flushdb()
        cmd = [sys.executable, "-m", "gateway", "serve", "--port", str(self.port)]
        if self.policy_path is not None:
            cmd += ["--policy", str(self.policy_path)]
        if self.redis_url:
            cmd += ["--redis-url", self.redis_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
        env.update({"SWITCHYARD_RELOAD_INTERVAL_S": "0.2", **self.env})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*cmd, *self.args], stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        try:
            wait_http_ok(self.url + "/healthz", 30, self.proc)
        except BaseException:
            self.stop()
            raise RuntimeError("gateway did not start:\n" + self.log_path.read_text()) from None
        return self

    def write_policy(self, text: str) -> None:
        assert self.policy_path is not None
        tmp = self.policy_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.policy_path)

    def log_lines(self) -> list[dict[str, Any]]:
        self._log.flush()
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def wait_log(self, predicate: Any, timeout_s: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_lines():
                if predicate(line):
                    return line
            time.sleep(0.05)
        raise AssertionError("no matching log line:\n" + self.log_path.read_text()[-4000:])

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
            self.proc = None
            self._log.close()
        return code


def sim_policy(sim_base_url: str, extra: str = "", *, provider: str = "vllm") -> str:
    """A policy with sim-fast and sim-strong on one simulator, one tier each (``provider``
    decides the wire format and where shaping may place volatile content)."""
    return f"""
deployments:
  sim-fast: {{provider: {provider}, base_url: "{sim_base_url}"}}
  sim-strong: {{provider: {provider}, base_url: "{sim_base_url}"}}
tiers:
  fast: [sim-fast]
  strong: [sim-strong]
{extra}
"""


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free right now on 127.0.0.1 (replicas
    take ``port``, ``port + 1`` ...: a single free port says nothing of the next one)."""
    while True:
        first = free_port()
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return first
