"""A policy deployment with ``launch:``: the gateway starts vLLM (the fake, on PATH), does not route
to it until /health answers, supervises it, and drains it on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import urllib.error
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.procutil import free_port
from tests.fixtures.fake_vllm_harness import FakeVllm
from tests.helpers import GatewayProcess, free_ports, http_json, readyz

# For tests that count launches: a loaded machine can miss three 0.2 s health checks in a row,
# and the restart that follows is right but is not what those tests look at.
PATIENT = "      health_failures_to_restart: 20"


def launch_policy(port: int, extra: str = "") -> str:
    return f"""
deployments:
  local-8b:
    provider: vllm
    model: llama-8b
    launch:
      model: org/Llama-8B
      port: {port}
      replicas: 2
      gpus: [0, 1]
      max_num_seqs: 16
      health_interval_s: 0.2
      restart_backoff_s: 0.2
{extra}
    replicas: {{health_interval_s: 0.2, metrics_interval_s: 0.2}}
tiers:
  fast: [local-8b]
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def replicas_state(gw: GatewayProcess) -> dict[str, Any]:
    state: dict[str, Any] = readyz(gw.url)["replicas"]["local-8b"]
    return state


def wait_for(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_gateway_launches_vllm_routes_once_healthy_and_drains_on_stop(
    tmp_path: Path, make_gateway: Any
) -> None:
    fake = FakeVllm(tmp_path)
    fake.control({"start_delay_s": 2.0})
    port = free_ports(2)
    gw = make_gateway(launch_policy(port, PATIENT), env=fake.env)
    with openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0) as client:
        # Loading: the deployment is known but not ready, and says so.
        assert replicas_state(gw) == {"ready": False, "healthy": 0, "replicas": 2}
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 503 and "is not ready" in info.value.message
        wait_for(lambda: replicas_state(gw)["healthy"] == 2)
        reply = client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
        assert reply.model == "llama-8b"
    launches = sorted(fake.launches(), key=lambda r: r["port"])
    assert [r["port"] for r in launches] == [port, port + 1]
    assert [r["cuda_visible_devices"] for r in launches] == ["0", "1"]
    argv = launches[0]["argv"]
    assert argv[:2] == ["serve", "org/Llama-8B"]
    assert argv[argv.index("--served-model-name") + 1] == "llama-8b"
    assert "--enable-prompt-tokens-details" in argv and "--enable-prefix-caching" in argv

    def processes_now() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = http_json("GET", gw.url + "/admin/replicas")["deployments"]["local-8b"][
            "processes"
        ]
        return found

    # The gateway's health checks may see both replicas before the supervisor's own poll does.
    wait_for(lambda: [p["state"] for p in processes_now()] == ["ready", "ready"], timeout_s=10)
    processes = processes_now()
    assert [p["pid"] for p in processes] == [r["pid"] for r in launches]
    assert gw.stop() == 0
    assert not any(alive(r["pid"]) for r in launches)  # drained and gone with the gateway
    lines = [json.loads(line) for line in gw.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(
        line.get("event") == "vllm_output" and "Shutdown complete" in line.get("line", "") for line in lines
    )
    assert any(line.get("event") == "vllm_stopped" for line in lines)


def test_gateway_restarts_a_launched_replica_that_dies(tmp_path: Path, make_gateway: Any) -> None:
    fake = FakeVllm(tmp_path)
    port = free_ports(2)
    fake.control({"ports": {str(port + 1): {"crash_after_s": 0.5, "crash_launches": 1}}})
    gw = make_gateway(launch_policy(port), env=fake.env)

    def restarted() -> bool:
        processes = http_json("GET", gw.url + "/admin/replicas")["deployments"]["local-8b"]["processes"]
        return processes[1]["restarts"] == 1 and processes[1]["state"] == "ready"

    wait_for(restarted)
    wait_for(lambda: replicas_state(gw)["healthy"] == 2)
    assert len([r for r in fake.launches() if r["port"] == port + 1]) == 2
    gw.wait_log(lambda line: line.get("event") == "vllm_exited" and line.get("exit_code") == 3)


def test_a_launch_this_machine_cannot_satisfy_stops_the_gateway_with_the_reason(
    tmp_path: Path, redis_url: str
) -> None:
    fake = FakeVllm(tmp_path)
    policy = launch_policy(free_port(), "      api_key_env: NOT_SET_ANYWHERE_42")
    gw = GatewayProcess(policy, redis_url=redis_url, workdir=tmp_path, env=fake.env)
    with pytest.raises(RuntimeError, match="gateway did not start") as info:
        gw.start()
    assert (
        "deployments.local-8b.launch: launch.api_key_env names NOT_SET_ANYWHERE_42, which is not set"
        in str(info.value)
    )
    assert fake.launches() == []


def test_workers_share_one_set_of_launched_replicas(tmp_path: Path, make_gateway: Any) -> None:
    fake = FakeVllm(tmp_path)
    port = free_ports(2)
    gw = make_gateway(launch_policy(port, PATIENT), env=fake.env, args=["--workers", "2"])
    wait_for(lambda: replicas_state(gw)["healthy"] == 2)
    assert len(fake.launches()) == 2  # started by the parent once, not per worker
    pids = [r["pid"] for r in fake.launches()]
    gw.stop(signal.SIGTERM)
    assert not any(alive(pid) for pid in pids)


def test_a_launch_the_preflight_refuses_is_not_ready_and_says_why(tmp_path: Path, make_gateway: Any) -> None:
    # Issue #50, item 12: the only deployment's launch can never start (its vLLM is not
    # installed): /readyz is not ready, and a request's 503 carries the preflight's reason.
    fake = FakeVllm(tmp_path)
    gw = make_gateway(launch_policy(free_ports(2), "      executable: vllm-not-installed-here"), env=fake.env)

    def refused() -> bool:
        return "launch_error" in replicas_state(gw)

    wait_for(refused)
    with pytest.raises(urllib.error.HTTPError) as ready:
        http_json("GET", gw.url + "/readyz")
    assert ready.value.code == 503
    body = json.loads(ready.value.read())
    assert body["status"] == "not_ready"
    assert any(
        p.startswith("tier fast: no deployment has a healthy replica (local-8b: launch refused: cannot start")
        and "not found on PATH" in p
        for p in body["problems"]
    ), body["problems"]
    with (
        openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0) as client,
        pytest.raises(openai.APIStatusError) as info,
    ):
        client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503
    assert "cannot start 'vllm-not-installed-here': not found on PATH" in info.value.message
    assert fake.launches() == []


def test_the_gateway_follows_a_replica_restarted_on_a_fresh_port(tmp_path: Path, make_gateway: Any) -> None:
    # Issue #50, item 11: the crashed replica leaves its port held; the supervisor restarts
    # it on a fresh port, and the gateway's routing follows it there.
    fake = FakeVllm(tmp_path)
    port = free_ports(2)
    fake.control(
        {"ports": {str(port + 1): {"crash_after_s": 0.5, "crash_launches": 1, "leave_behind_s": 60}}}
    )
    gw = make_gateway(launch_policy(port, "      exit_wait_s: 1"), env=fake.env)
    left_file = fake.record_path.with_suffix(f".left-{port + 1}")
    try:
        wait_for(lambda: len(fake.launches()) == 3, timeout_s=30)
        moved_to = fake.launches()[2]["port"]
        assert moved_to not in (port, port + 1)

        def routed_there() -> bool:
            replicas = http_json("GET", gw.url + "/admin/replicas")["deployments"]["local-8b"]["replicas"]
            return bool(replicas[1]["url"] == f"http://127.0.0.1:{moved_to}/v1" and replicas[1]["healthy"])

        wait_for(routed_there, timeout_s=20)
        assert replicas_state(gw)["healthy"] == 2
    finally:
        if left_file.exists():
            os.kill(int(left_file.read_text()), signal.SIGKILL)


def test_replicas_whose_streams_progress_stay_routable_while_health_is_slow(
    tmp_path: Path, make_gateway: Any
) -> None:
    # Issue #50, item 13: under long streams vLLM's /health answers late (here after 3 s;
    # the gateway's checks give up after 0.3 s), but tokens keep flowing through the gateway:
    # the replicas stay healthy, new requests are still routed, nothing is restarted.
    fake = FakeVllm(tmp_path)
    fake.control({"slow_health_while_busy_s": 3, "output_tokens": [300, 300], "itl_ms": 15})
    policy = launch_policy(free_ports(2)).replace(
        "replicas: {health_interval_s: 0.2, metrics_interval_s: 0.2}",
        "replicas: {health_interval_s: 0.2, metrics_interval_s: 0.2, probe_timeout_s: 0.3}",
    )
    gw = make_gateway(policy, env=fake.env)
    wait_for(lambda: replicas_state(gw)["healthy"] == 2)
    messages = [{"role": "user", "content": "a long answer"}]

    def stream(i: int) -> int:
        with openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0) as client:
            events = client.chat.completions.create(
                model="fast", messages=[{"role": "system", "content": f"client {i}"}, *messages], stream=True
            )
            return sum(1 for e in events if e.choices and e.choices[0].delta.content)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(stream, i) for i in range(6)]
        time.sleep(2.0)  # several health checks have timed out by now
        assert replicas_state(gw)["healthy"] == 2
        with openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0) as client:
            reply = client.chat.completions.create(model="fast", messages=messages, max_tokens=4)
        assert reply.choices[0].message.content
        chunks = [s.result(timeout=30) for s in streams]
    assert len(set(chunks)) == 1 and chunks[0] > 0  # every stream whole
    assert len(fake.launches()) == 2  # no replica restarted
    gw.wait_log(lambda line: line.get("event") == "replica_health_slow_but_streaming")
