"""Supervising vllm serve, with tests/fixtures/fake_vllm_program.py on PATH as ``vllm``: real processes,
real HTTP health checks, real signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import openai
import pytest
import structlog

from gateway.procutil import free_port
from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import plan_replicas
from local_backend.vllm import ReplicaState, Supervisor
from tests.fixtures.fake_vllm_harness import FakeVllm
from tests.helpers import ROOT, free_ports

T = TypeVar("T")


@pytest.fixture()
def fake(tmp_path: Path) -> FakeVllm:
    return FakeVllm(tmp_path)


def launch(**knobs: Any) -> VllmLaunch:
    defaults: dict[str, Any] = {
        "model": "org/tiny-model",
        "served_model_name": "tiny",
        "port": free_ports(2),
        "health_interval_s": 0.2,
        "restart_backoff_s": 0.2,
        "startup_timeout_s": 30,
        "drain_timeout_s": 10,
    }
    return VllmLaunch(**{**defaults, **knobs})


def run(main: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), timeout_s)

    return asyncio.run(bounded())


async def until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture()
def logs() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("event") == name]


def test_replicas_start_on_their_own_gpus_and_ports_and_serve(fake: FakeVllm) -> None:
    config = launch(replicas=2, gpus=[3, 5], max_num_seqs=32)
    plans = plan_replicas(config, "local", fake.env)

    async def main() -> dict[str, Any]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        try:
            assert await supervisor.wait_ready(30)
            assert supervisor.is_ready("local")
            return supervisor.status()
        finally:
            await supervisor.stop()

    status = run(main)
    records = sorted(fake.launches(), key=lambda r: r["port"])
    assert [r["argv"] for r in records] == [list(p.argv[1:]) for p in plans]  # exactly as planned
    assert [r["cuda_visible_devices"] for r in records] == ["3", "5"]
    assert [r["port"] for r in records] == [config.port, config.port + 1]
    assert all(r["pythonunbuffered"] == "1" for r in records)
    assert "--max-num-seqs" in records[0]["argv"] and "--enable-prompt-tokens-details" in records[0]["argv"]
    assert [s["state"] for s in status["local"]] == ["ready", "ready"]
    assert all(not alive(r["pid"]) for r in records)


def test_a_ready_replica_answers_the_openai_sdk_with_cached_tokens(fake: FakeVllm) -> None:
    config = launch()

    async def main() -> None:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        try:
            assert await supervisor.wait_ready(30)
            url = supervisor.plans["local"][0].base_url

            def ask() -> Any:
                with openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client:
                    system = {"role": "system", "content": "You are terse. " * 40}
                    for _ in range(2):
                        reply = client.chat.completions.create(
                            model="tiny", messages=[system, {"role": "user", "content": "hi"}]
                        )
                    return reply

            reply = await asyncio.to_thread(ask)
            assert reply.usage.prompt_tokens_details.cached_tokens > 0
        finally:
            await supervisor.stop()

    run(main)


def test_replica_output_becomes_structured_log_lines(fake: FakeVllm, logs: list[dict[str, Any]]) -> None:
    config = launch()

    async def main() -> None:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        assert await supervisor.wait_ready(30)
        await supervisor.stop()

    run(main)
    lines = events(logs, "vllm_output")
    started = [entry for entry in lines if "Starting vLLM API server" in entry["line"]]
    assert started and started[0]["replica"] == "local[0]" and started[0]["log_level"] == "info"
    assert any("Shutdown complete" in entry["line"] for entry in lines)
    assert events(logs, "vllm_starting")[0]["command"].startswith(
        "CUDA_VISIBLE_DEVICES=0 vllm serve org/tiny-model"
    )
    assert events(logs, "vllm_ready")[0]["url"] == f"http://127.0.0.1:{config.port}/v1"


def test_a_replica_that_dies_is_restarted_and_ready_again(fake: FakeVllm, logs: list[dict[str, Any]]) -> None:
    fake.control({"crash_after_s": 0.5, "crash_launches": 1, "crash_exit_code": 3})
    config = launch()

    async def main() -> dict[str, Any]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        try:
            replica = supervisor.replicas["local"][0]
            await until(lambda: replica.restarts == 1 and replica.state is ReplicaState.READY)
            return replica.status()
        finally:
            await supervisor.stop()

    status = run(main)
    assert status["last_exit_code"] == 3 and status["starts"] == 2
    assert len(fake.launches()) == 2
    assert events(logs, "vllm_exited")[0]["exit_code"] == 3
    restarting = events(logs, "vllm_restarting")[0]
    assert restarting["reason"] == "exited" and restarting["restart_in_s"] == 0.2
    assert any("EngineCore died" in line for line in restarting["last_lines"])
    crash_lines = [e for e in events(logs, "vllm_output") if "EngineCore died" in e["line"]]
    assert crash_lines[0]["log_level"] == "error"


def test_restart_backoff_doubles_up_to_its_maximum(fake: FakeVllm, logs: list[dict[str, Any]]) -> None:
    fake.control({"crash_after_s": 0.1})
    config = launch(restart_backoff_s=0.1, restart_backoff_max_s=0.3, max_restarts=3)

    async def main() -> ReplicaState:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        replica = supervisor.replicas["local"][0]
        await until(lambda: replica.state is ReplicaState.FAILED, 40)
        await supervisor.stop()
        return replica.state

    assert run(main) is ReplicaState.FAILED
    assert [e["restart_in_s"] for e in events(logs, "vllm_restarting")] == [0.1, 0.2, 0.3]
    assert events(logs, "vllm_gave_up")[0]["restarts"] == 3
    assert len(fake.launches()) == 4


def test_a_slow_start_past_the_deadline_is_killed_and_retried(
    fake: FakeVllm, logs: list[dict[str, Any]]
) -> None:
    fake.control({"start_delay_s": 60})
    config = launch(startup_timeout_s=1.0, max_restarts=1)

    async def main() -> dict[str, Any]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        replica = supervisor.replicas["local"][0]
        assert not await supervisor.wait_ready(0.5)
        assert replica.state is ReplicaState.STARTING and not supervisor.is_ready("local")
        await until(lambda: replica.state is ReplicaState.FAILED, 30)
        await supervisor.stop()
        return replica.status()

    status = run(main)
    assert "startup_timeout_s=1.0" in status["last_error"]
    assert [e["timeout_s"] for e in events(logs, "vllm_startup_timeout")] == [1.0, 1.0]
    records = fake.launches()
    assert len(records) == 2
    assert all(not alive(r["pid"]) for r in records)


def test_a_replica_whose_health_fails_is_restarted(fake: FakeVllm, logs: list[dict[str, Any]]) -> None:
    fake.control({"unhealthy_after_s": 0.3})
    config = launch(health_failures_to_restart=2, max_restarts=1)

    async def main() -> None:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        replica = supervisor.replicas["local"][0]
        await until(lambda: replica.state is ReplicaState.FAILED, 30)
        await supervisor.stop()

    run(main)
    assert [e["consecutive"] for e in events(logs, "vllm_health_failed")][:2] == [1, 2]
    assert events(logs, "vllm_restarting")[0]["reason"] == "unhealthy"
    assert len(fake.launches()) == 2


def test_stop_lets_requests_in_flight_finish(fake: FakeVllm) -> None:
    fake.control({"ttft_ms": 5, "itl_ms": 60, "output_tokens": [25, 25]})
    config = launch()

    async def main() -> tuple[list[bytes], int | None, float]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        assert await supervisor.wait_ready(30)
        replica = supervisor.replicas["local"][0]
        url = supervisor.plans["local"][0].base_url + "/chat/completions"
        body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "count"}]}
        events_seen: list[bytes] = []
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
            stopping: asyncio.Task[None] | None = None
            t0 = 0.0
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events_seen.append(line.strip())
                    if stopping is None:
                        t0 = time.monotonic()
                        stopping = asyncio.create_task(supervisor.stop())  # SIGTERM mid-stream
            assert stopping is not None
            await stopping
        return events_seen, replica.last_exit_code, time.monotonic() - t0

    seen, exit_code, took_s = run(main)
    assert seen[-1] == b"data: [DONE]"
    assert len([e for e in seen if b'"content"' in e]) >= 25  # every token arrived
    assert exit_code == 0
    assert took_s < config.drain_timeout_s


def test_a_replica_that_ignores_sigterm_is_killed_after_the_drain_timeout(
    fake: FakeVllm, logs: list[dict[str, Any]]
) -> None:
    fake.control({"ignore_sigterm": True})
    config = launch(drain_timeout_s=1.0)

    async def main() -> tuple[float, int | None]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        assert await supervisor.wait_ready(30)
        t0 = time.monotonic()
        await supervisor.stop()
        return time.monotonic() - t0, supervisor.replicas["local"][0].last_exit_code

    took_s, exit_code = run(main)
    assert 1.0 <= took_s < 10.0
    assert exit_code == -signal.SIGKILL
    assert events(logs, "vllm_killed")[0]["after_s"] == 1.0
    assert not alive(fake.launches()[0]["pid"])


def test_an_executable_that_does_not_exist_fails_clearly(tmp_path: Path) -> None:
    config = launch(executable=str(tmp_path / "no-such-vllm"))

    async def main() -> dict[str, Any]:
        supervisor = Supervisor({"local": config}, {})
        await supervisor.start()
        replica = supervisor.replicas["local"][0]
        await until(lambda: replica.state is ReplicaState.FAILED, 10)
        await supervisor.stop()
        return replica.status()

    status = run(main)
    assert status["state"] == "failed"
    assert "cannot start" in status["last_error"] and "no-such-vllm" in status["last_error"]


# -- switchyard local serve ------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    return path


def test_local_serve_dry_run_prints_each_replicas_command(tmp_path: Path) -> None:
    path = write_config(tmp_path, "model: org/m\nreplicas: 2\ngpus: [2, 3]\nport: 9100\nmax_num_seqs: 8\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "local", "serve", str(path), "--dry-run"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=2 vllm serve org/m --host 127.0.0.1 --port 9100 ")
    assert lines[1].startswith("CUDA_VISIBLE_DEVICES=3 vllm serve org/m --host 127.0.0.1 --port 9101 ")
    assert all("--max-num-seqs 8" in line for line in lines)


def test_local_serve_reports_a_bad_config_and_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, "model: org/m\nreplicas: 2\ntensor_parallel_size: 2\ngpus: [0, 1]\n")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "local", "serve", str(path)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "4 GPUs needed, but gpus lists 2" in out.stderr


def test_local_serve_supervises_until_sigterm_then_drains(fake: FakeVllm, tmp_path: Path) -> None:
    port = free_port()
    path = write_config(
        tmp_path, f"model: org/m\nserved_model_name: m\nport: {port}\nhealth_interval_s: 0.2\n"
    )
    log_path = tmp_path / "local-serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "local", "serve", str(path), "--name", "m8b"],
            stdout=log, stderr=subprocess.STDOUT, env=fake.env, cwd=ROOT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "vllm_ready" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            assert reply.choices[0].message.content
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    names = [line["event"] for line in lines]
    assert "vllm_starting" in names and "vllm_ready" in names and "vllm_stopped" in names
    output = [line for line in lines if line["event"] == "vllm_output"]
    assert any("Shutting down" in line["line"] and line["replica"] == "m8b[0]" for line in output)
    assert not alive(fake.launches()[0]["pid"])


def test_local_serve_without_vllm_installed_exits_2_with_a_hint(tmp_path: Path) -> None:
    path = write_config(tmp_path, "model: org/m\n")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "local", "serve", str(path)],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=60,
        env={**os.environ, "PATH": str(empty)},
    )  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "vLLM is not installed" in lines[0] and "pip install 'switchyard[local]'" in lines[0]


def test_a_crash_that_leaves_the_port_held_restarts_on_a_fresh_port_without_waiting(
    fake: FakeVllm, tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    # Issue #50, item 11: the crashed server leaves a process (outside its group, deaf to
    # SIGTERM) holding the output pipe and the port for 60 s. The restart waits exit_wait_s,
    # logs what is left, and starts on a fresh port.
    config = launch(exit_wait_s=1.0)
    fake.control({"crash_after_s": 0.5, "crash_launches": 1, "leave_behind_s": 60})
    left_file = fake.record_path.with_suffix(f".left-{config.port}")

    async def main() -> tuple[dict[str, Any], float]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        try:
            replica = supervisor.replicas["local"][0]
            await until(lambda: replica.restarts == 1, timeout_s=20)
            crashed_at = time.monotonic()
            await until(lambda: replica.state is ReplicaState.READY, timeout_s=20)
            async with (
                aiohttp.ClientSession() as session,
                session.get(replica.plan.health_url) as resp,
            ):
                assert resp.status == 200
            return replica.status(), time.monotonic() - crashed_at
        finally:
            await supervisor.stop()
            if left_file.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(left_file.read_text()), signal.SIGKILL)

    status, ready_after_s = run(main)
    assert ready_after_s < 15  # not the 60 s the leftover holds on
    ports = [r["port"] for r in fake.launches()]
    assert ports[0] == config.port and ports[1] != config.port
    assert status["url"] == f"http://127.0.0.1:{ports[1]}/v1"
    over = events(logs, "vllm_exit_wait_over")[0]
    assert over["port_held"] is True and over["output_open"] is True and over["waited_s"] == 1.0
    moved = events(logs, "vllm_port_moved")[0]
    assert (moved["old_port"], moved["port"]) == (config.port, ports[1])


def test_a_replica_whose_streams_still_produce_tokens_is_not_restarted_for_slow_health(
    fake: FakeVllm, logs: list[dict[str, Any]]
) -> None:
    # Issue #50, item 13: while it streams, the replica's /health answers after 3 s (the
    # checks time out after 0.4 s), but its generation-token counter keeps growing: slow
    # because busy, not down. The streams finish whole and nothing restarts.
    fake.control({"slow_health_while_busy_s": 3, "output_tokens": [240, 240], "itl_ms": 20})
    config = launch(health_failures_to_restart=2)

    async def main() -> tuple[list[int], dict[str, Any]]:
        supervisor = Supervisor({"local": config}, fake.env)
        await supervisor.start()
        try:
            assert await supervisor.wait_ready(30)
            replica = supervisor.replicas["local"][0]

            def stream() -> int:
                with openai.OpenAI(base_url=replica.plan.base_url, api_key="x", max_retries=0) as client:
                    events = client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "a long answer"}], stream=True
                    )
                    return sum(1 for event in events if event.choices and event.choices[0].delta.content)

            chunks = await asyncio.gather(*(asyncio.to_thread(stream) for _ in range(3)))
            return list(chunks), replica.status()
        finally:
            await supervisor.stop()

    chunks, status = run(main)
    assert all(n > 0 for n in chunks) and len(set(chunks)) == 1  # all whole, none cut
    assert status["restarts"] == 0 and not events(logs, "vllm_restarting")
    assert events(logs, "vllm_health_failed")  # the checks did fail ...
    assert events(logs, "vllm_health_slow_but_generating")  # ... and progress counted as health
