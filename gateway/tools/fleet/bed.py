"""The fleet test bed: a Redis Cluster, simulator hosts standing in for vLLM replicas, and
gateway hosts, each on a host of a :class:`~gateway.tools.fleet.net.Topology`.

``FleetBed(topology, workdir).start()`` brings up, in order: ``masters`` x (1 +
``replicas``) ``redis-server`` nodes joined by ``redis-cli --cluster create``, ``sims``
simulators (``python -m local_backend.sim``), the policy (one vLLM deployment whose
replicas are the simulators) pushed to the cluster with ``switchyard policy push``, and
``gateways`` gateways following it (``SWITCHYARD_POLICY_FROM_REDIS=1``), with virtual keys
on and an admin key. Everything the bed itself asks of a host (is it up?) it asks from the
load-generator host, so the caller should run inside it: ``with bed.inside(): ...``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from gateway.procutil import free_port, wait_http_ok
from gateway.tools.fleet.net import Host, Topology

ADMIN_KEY = "fleet-admin-key"
MODEL = "fleet"
_ROOT = Path(__file__).resolve().parents[3]


class Node:
    """One process on one host, its output in ``<workdir>/<name>.log``."""

    def __init__(self, name: str, host: Host, port: int, argv: list[str], workdir: Path, env: dict[str, str]):
        self.name, self.host, self.port = name, host, port
        self.argv, self.env = argv, env
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    def start(self) -> Node:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
        env.update(self.env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.host.command(self.argv), stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=_ROOT
        )
        return self

    def send(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 40.0) -> int | None:
        """Wait for the process to end (killed past ``timeout_s``); its exit code."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
        return code

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        self.send(sig)
        return self.wait()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 10
) -> Any:
    """A JSON request (urllib: no event loop needed); raises on a non-2xx status."""
    data = None if body is None else orjson.dumps(body)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return orjson.loads(resp.read() or b"null")


def admin(url: str, path: str, method: str = "GET", body: Any = None) -> Any:
    """An admin API call with the bed's admin key."""
    return http(method, url + path, body, {"Authorization": f"Bearer {ADMIN_KEY}"})


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.1)


def _port(host: Host, fixed: int, bus: bool = False) -> int:
    if host.netns is not None:
        return fixed
    while True:  # loopback hosts share one port space
        port = free_port()
        if not bus:
            return port
        if port + 10000 <= 65535:
            with socket.socket() as sock, contextlib.suppress(OSError):
                sock.bind(("127.0.0.1", port + 10000))
                return port


def fleet_policy(sim_urls: list[str], comment: str = "", extra: str = "") -> str:
    """The bed's policy: vLLM deployments served by every simulator, prefix affinity on:
    ``local`` (tier ``fast``, priced) and ``local-slow`` (tiers ``slow`` and ``strong``: streams
    of about 1.2 s); ``extra`` is appended (a ``routing:`` block, say)."""
    urls = ", ".join(f'"{u}/v1"' for u in sim_urls)
    return f"""# fleet test bed policy {comment}
deployments:
  local:
    provider: vllm
    model: {MODEL}
    price: {{input: 1.0, cached_input: 0.1, output: 2.0}}
    replicas:
      urls: [{urls}]
      health_interval_s: 0.5
      metrics_interval_s: 1.0
  local-slow:
    provider: vllm
    model: {MODEL}-slow
    replicas: {{urls: [{urls}], health_interval_s: 0.5, metrics_interval_s: 1.0}}
tiers:
  fast: [local]
  slow: [local-slow]
  strong: [local-slow]
dispatch:
  # A cut-off host answers nothing: give up on it (and retry elsewhere) in seconds.
  timeouts: {{connect_s: 1, first_token_s: 3, first_byte_s: 3}}
{extra}"""


class FleetBed:
    """Starts and stops the bed's processes (see the module docstring)."""

    def __init__(
        self,
        topology: Topology,
        workdir: Path,
        *,
        gateways: int = 3,
        masters: int = 3,
        replicas: int = 1,
        sims: int = 2,
        gateway_env: dict[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.workdir = workdir
        self.counts = (gateways, masters, replicas, sims)
        self.gateway_settings = {
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_POLICY_FROM_REDIS": "1",
            "SWITCHYARD_RELOAD_INTERVAL_S": "0.5",
            "SWITCHYARD_HEARTBEAT_S": "0.5",
            "SWITCHYARD_DRAIN_TIMEOUT_S": "20",
            **(gateway_env or {}),
        }
        """The gateways' environment (``gateway_env`` overrides the bed's defaults)."""
        self.redis: list[Node] = []
        self.sims: list[Node] = []
        self.gateways: list[Node] = []
        self.loadgen: Host = topology.add("lg")

    @property
    def redis_url(self) -> str:
        return "redis+cluster://" + ",".join(f"{n.host.address}:{n.port}" for n in self.redis[:3])

    def inside(self) -> contextlib.AbstractContextManager[None]:
        """Run the calling thread on the load-generator host."""
        return self.topology.inside(self.loadgen)

    def start(self) -> FleetBed:
        gateways, masters, replicas, sims = self.counts
        with self.inside():
            self._start_redis(masters * (1 + replicas), replicas)
            for i in range(sims):
                host = self.topology.add(f"s{i + 1}")
                argv = [sys.executable, "-m", "local_backend.sim", "--host", host.address]
                node = Node(f"sim-{i + 1}", host, _port(host, 8000), argv, self.workdir, {})
                node.argv += [
                    "--port",
                    str(node.port),
                    "--model",
                    f"{MODEL}:3:1",
                    "--model",
                    f"{MODEL}-slow:50:150",
                ]
                node.argv += ["--output-tokens", "8"]
                self.sims.append(node.start())
            for node in self.sims:
                wait_http_ok(node.url + "/health", 30, node.proc)
            self.policy_path = self.workdir / "policy.yaml"
            self.push_policy(fleet_policy([n.url for n in self.sims]))
            for i in range(gateways):
                self.gateways.append(self._gateway(self.topology.add(f"g{i + 1}"), i + 1).start())
            for node in self.gateways:
                self.wait_ready(node)
        return self

    def _start_redis(self, count: int, replicas: int) -> None:
        for i in range(count):
            host = self.topology.add(f"r{i + 1}")
            port = _port(host, 6379, bus=True)
            wd = self.workdir / f"redis-{i + 1}"
            wd.mkdir(parents=True, exist_ok=True)
            # A cluster of its own, every time: no node table, and no data a replica's sync
            # wrote last time (Redis loads a dump.rdb it finds, even with saving off).
            (wd / "nodes.conf").unlink(missing_ok=True)
            (wd / "dump.rdb").unlink(missing_ok=True)
            argv = [
                "redis-server", "--bind", host.address, "--port", str(port), "--cluster-enabled", "yes",
                "--cluster-config-file", str(wd / "nodes.conf"), "--dir", str(wd),
                "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--cluster-announce-ip", host.address,
            ]  # fmt: skip
            self.redis.append(Node(f"redis-{i + 1}", host, port, argv, self.workdir, {}).start())
        for node in self.redis:
            wait_for(lambda n=node: self._redis_cli(n, "ping") == "PONG", 20, f"{node.name} up")
        nodes = [f"{n.host.address}:{n.port}" for n in self.redis]
        first = self.redis[0]
        created = subprocess.run(
            first.host.command(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *nodes,
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        for node in self.redis:
            wait_for(
                lambda n=node: "cluster_state:ok" in self._redis_cli(n, "cluster", "info"), 30, "cluster ok"
            )

    def _redis_cli(self, node: Node, *args: str) -> str:
        argv = ["redis-cli", "-h", node.host.address, "-p", str(node.port), *args]
        done = subprocess.run(node.host.command(argv), capture_output=True, text=True, timeout=10)
        return done.stdout.strip()

    def redis_masters(self) -> list[Node]:
        """The nodes that are masters now (a failover changes which)."""
        return [
            n
            for n in self.redis
            if n.proc is not None and "role:master" in self._redis_cli(n, "info", "replication")
        ]

    def _gateway(self, host: Host, index: int) -> Node:
        port = _port(host, 8080)
        argv = [
            sys.executable, "-m", "gateway", "serve", "--host", host.address, "--port", str(port),
            "--policy", str(self.policy_path), "--redis-url", self.redis_url, "--auth", "keys",
        ]  # fmt: skip
        return Node(f"gateway-{index}", host, port, argv, self.workdir, self.gateway_settings)

    def wait_ready(self, node: Node, timeout_s: float = 40) -> None:
        try:
            wait_for(
                lambda: http("GET", node.url + "/readyz")["status"] == "ready",
                timeout_s,
                f"{node.name} ready",
            )
        except TimeoutError:
            raise RuntimeError(f"{node.name} did not get ready:\n{node.log_tail()}") from None

    def push_policy(self, text: str) -> str:
        """Write ``text`` to the policy file and push it to the cluster; its digest."""
        self.policy_path.write_text(text)
        argv = [
            sys.executable,
            "-m",
            "gateway",
            "policy",
            "push",
            str(self.policy_path),
            "--redis-url",
            self.redis_url,
        ]
        done = subprocess.run(
            self.loadgen.command(argv), capture_output=True, text=True, cwd=_ROOT, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"policy push failed: {done.stdout}{done.stderr}")
        return done.stdout.split("digest ")[1].split()[0]

    def create_key(self, name: str, **limits: Any) -> str:
        """A virtual key (through the first gateway's admin API); its secret."""
        return str(admin(self.gateways[0].url, "/admin/keys", "POST", {"name": name, **limits})["key"])

    def restart_gateway(self, node: Node) -> None:
        """Start a stopped gateway again and wait until it is ready."""
        node.start()
        self.wait_ready(node)

    def stop(self) -> None:
        """Stop every process (gateways first, Redis last)."""
        for node in [*self.gateways, *self.sims, *self.redis]:
            with contextlib.suppress(Exception):
                node.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[FleetBed]:
        """The bed started for the block, stopped (and the topology removed) at its end."""
        try:
            self.start()
            yield self
        finally:
            self.stop()
            self.topology.close()
