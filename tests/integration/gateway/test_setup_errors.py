"""Bad set-up gets one clear line and the right exit code or readiness, through the real
``switchyard serve`` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.procutil import free_port
from tests.helpers import ROOT, GatewayProcess, SimServer

DEFAULT_POLICY = (ROOT / "policies" / "default.yaml").read_text()


def _serve_fails(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_") and k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**clean, **(env or {})},
    )


def _readyz(gw: GatewayProcess) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(gw.url + "/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _warnings(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    """The log lines of ``event`` (set-up warnings come before ``listening``, in order)."""
    gw.wait_log(lambda line: line.get("event") == "listening")
    return [line for line in gw.log_lines() if line.get("event") == event]


def test_a_redis_url_without_a_scheme_is_one_line_and_exit_2() -> None:
    result = _serve_fails(env={"REDIS_URL": "localhost:6379"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "switchyard: bad settings: REDIS_URL 'localhost:6379' has no scheme: write "
        "redis://localhost:6379 (or rediss://, unix:///path/to.sock, redis+cluster://)"
    ]
    assert "Traceback" not in result.stdout + result.stderr


def test_a_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve_fails("--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"switchyard: port {port} on 127.0.0.1 is already in use (another gateway or server is "
        "running there): stop it, or pick another port with --port or SWITCHYARD_PORT"
    ]
    assert "Traceback" not in result.stdout + result.stderr


def test_an_unreachable_redis_warns_and_is_not_ready(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    gw = GatewayProcess(None, redis_url=url, workdir=tmp_path, flush_redis=False).start()
    try:
        status, body = _readyz(gw)
        assert status == 503 and body["status"] == "not_ready" and body["redis"] is False
        assert body["problems"] == [
            f"cannot reach Redis at {url} (REDIS_URL): start Redis there, fix REDIS_URL, or unset it "
            "to use an embedded Redis"
        ]
        (line,) = _warnings(gw, "redis_unreachable")
        assert line["url"] == url and line["message"] == body["problems"][0]
        assert "Traceback" not in gw.log_path.read_text()
        assert gw.stop(signal.SIGTERM) == 0
    finally:
        gw.stop()


def test_a_redis_password_is_not_shown(tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    gw = GatewayProcess(None, redis_url=url, workdir=tmp_path, flush_redis=False).start()
    try:
        status, body = _readyz(gw)
        assert status == 503 and "redis://:***@127.0.0.1" in body["problems"][0]
        gw.wait_log(lambda line: line.get("event") == "redis_unreachable")
        assert "hunter2" not in json.dumps(body) and "hunter2" not in gw.log_path.read_text()
    finally:
        gw.stop()


def test_an_unset_api_key_warns_and_its_tiers_are_not_ready(make_gateway: Any) -> None:
    gw: GatewayProcess = make_gateway(DEFAULT_POLICY, env={"OPENAI_API_KEY": ""})
    status, body = _readyz(gw)
    assert status == 503 and body["status"] == "not_ready"
    assert body["missing_keys"] == {"gpt-fast": "OPENAI_API_KEY", "gpt-strong": "OPENAI_API_KEY"}
    assert body["problems"] == [
        f"tier {tier}: no deployment has its API key (gpt-{tier}: OPENAI_API_KEY not set): set it in "
        "the gateway's environment and restart"
        for tier in ("fast", "strong")
    ]
    (line,) = _warnings(gw, "api_key_missing")
    assert line["env"] == "OPENAI_API_KEY" and line["deployments"] == ["gpt-fast", "gpt-strong"]
    assert line["message"].startswith("OPENAI_API_KEY is not set, so gpt-fast, gpt-strong cannot answer")


def test_a_set_api_key_is_ready(make_gateway: Any) -> None:
    gw: GatewayProcess = make_gateway(DEFAULT_POLICY, env={"OPENAI_API_KEY": "sk-test"})
    status, body = _readyz(gw)
    assert status == 200 and body["status"] == "ready" and body["problems"] == []
    assert body["missing_keys"] == {} and not _warnings(gw, "api_key_missing")


def test_a_tier_with_one_keyed_deployment_stays_ready(sim: SimServer, make_gateway: Any) -> None:
    policy = f"""
deployments:
  keyed: {{provider: vllm, base_url: "{sim.base_url}"}}
  keyless: {{provider: openai, base_url: "{sim.base_url}", api_key_env: SWITCHYARD_TEST_UNSET_KEY}}
tiers:
  fast: [keyless, keyed]
"""
    gw: GatewayProcess = make_gateway(policy)
    status, body = _readyz(gw)
    assert status == 200 and body["status"] == "ready"
    assert body["missing_keys"] == {"keyless": "SWITCHYARD_TEST_UNSET_KEY"}
    assert _warnings(gw, "api_key_missing")[0]["deployments"] == ["keyless"]
