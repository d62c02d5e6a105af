"""Input limits, fixed upstreams, and no secret in anything the gateway writes or answers."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.procutil import free_port
from tests.helpers import GatewayProcess, SimServer, sim_policy
from tests.integration.gateway.test_errors import assert_openai_error, raw_post
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

UPSTREAM_KEY = "sk-upstream-3f9a7c1e55d2b8e0"
WRONG_UPSTREAM_KEY = "sk-upstream-wrong-9d8c7b6a5f4e"
HEADER_SECRET = "hdr-secret-71c0a9e4d2f5"


@pytest.fixture(scope="module")
def limited(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        sim_policy(sim.base_url),
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("limited"),
        env={
            "SWITCHYARD_MAX_MESSAGES": "8",
            "SWITCHYARD_MAX_CONTENT_PARTS": "4",
            "SWITCHYARD_MAX_JSON_DEPTH": "10",
            "SWITCHYARD_MAX_BODY_BYTES": "65536",
        },
    ).start()
    yield gw
    gw.stop()


def post(gw: GatewayProcess, body: Any) -> tuple[int, dict[str, Any]]:
    status, _, answer = raw_post(gw.base_url + "/chat/completions", json.dumps(body).encode())
    return status, assert_openai_error(answer) if status >= 400 else answer


def test_each_input_limit_is_a_clear_error(limited: GatewayProcess) -> None:
    many = [{"role": "user", "content": "hi"}] * 9
    status, err = post(limited, {"model": "fast", "messages": many})
    assert status == 400 and err["param"] == "messages" and err["code"] == "array_above_max_length"
    assert post(limited, {"model": "fast", "messages": many[:8]})[0] == 200

    parts = [{"type": "text", "text": "x"}] * 5
    status, err = post(
        limited,
        {"model": "fast", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": parts}]},
    )
    assert status == 400 and err["param"] == "messages[1].content"

    deep: Any = "x"
    for _ in range(12):
        deep = {"a": deep}
    status, err = post(
        limited, {"model": "fast", "messages": [{"role": "user", "content": "a"}], "extra": deep}
    )
    assert status == 400 and err["code"] == "json_too_deep"
    # Deeper than the JSON parser's own limit: still a 400, never a 500.
    status, _, body = raw_post(limited.base_url + "/chat/completions", b"[" * 5000 + b"]" * 5000)
    assert status == 400 and assert_openai_error(body)

    big = {"model": "fast", "messages": [{"role": "user", "content": "x" * 70_000}]}
    status, err = post(limited, big)
    assert status == 413 and err["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fast", "messages": "hi"}, "messages"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        (
            {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"},
            "max_tokens",
        ),
        ({"model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"model": "fast", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
            "temperature",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ],
)
def test_wrong_types_are_400_naming_the_parameter(limited: GatewayProcess, body: Any, param: str) -> None:
    status, err = post(limited, body)
    assert status == 400 and err["param"] == param and err["type"] == "invalid_request_error"


class _Capture(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_POST(self) -> None:
        _Capture.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def capture() -> Iterator[str]:
    _Capture.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture()
def guarded(make_gateway: Any) -> Iterator[tuple[GatewayProcess, SimServer]]:
    """A keyed gateway whose simulator wants the upstream key; one deployment has the wrong one."""
    with SimServer("--model", "sim-fast:5:1", "--require-api-key", UPSTREAM_KEY) as sim:
        policy = f"""
deployments:
  sim-fast:
    provider: vllm
    base_url: "{sim.base_url}"
    api_key_env: SIM_UPSTREAM_KEY
    headers: {{x-upstream-token: "${{HEADER_SECRET}}"}}
  wrong-key: {{provider: vllm, base_url: "{sim.base_url}", model: sim-fast, api_key_env: WRONG_KEY}}
tiers: {{fast: [sim-fast]}}
dispatch: {{retries: {{max: 0}}}}
"""
        env = {
            "SWITCHYARD_AUTH": "keys",
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SIM_UPSTREAM_KEY": UPSTREAM_KEY,
            "WRONG_KEY": WRONG_UPSTREAM_KEY,
            "HEADER_SECRET": HEADER_SECRET,
        }
        yield make_gateway(policy, env=env), sim


def test_no_request_field_or_header_changes_the_upstream(
    guarded: tuple[GatewayProcess, SimServer], capture: str
) -> None:
    gw, _ = guarded
    _, made = admin(gw, "POST", "/admin/keys", {"name": "probe"})
    client = openai.OpenAI(base_url=gw.base_url, api_key=made["key"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={
            "base_url": capture + "/v1",
            "api_base": capture + "/v1",
            "url": capture,
            "extra_headers": {"Authorization": "Bearer evil"},
            "api_key": "evil",
            "metadata": {"switchyard_tier": capture},
        },
        extra_headers={
            "X-Forwarded-Host": capture[7:],
            "X-Upstream-Token": "evil",
            "x-switchyard-tier": "../../" + capture,
        },
    )
    # The simulator only answers with the policy's key: the client's did not replace it.
    assert raw.parse().choices and raw.headers["x-switchyard-model"] == "sim-fast"
    assert _Capture.hits == []
    for value in raw.headers.values():
        assert UPSTREAM_KEY not in value and HEADER_SECRET not in value


def test_no_secret_in_logs_admin_answers_errors_or_headers(guarded: tuple[GatewayProcess, SimServer]) -> None:
    gw, _ = guarded
    seen: list[str] = []

    def call(method: str, path: str, body: Any = None, key: str | None = None) -> int:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(gw.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                seen.append(json.dumps(dict(resp.headers)) + resp.read().decode())
                return resp.status
        except urllib.error.HTTPError as exc:
            seen.append(json.dumps(dict(exc.headers)) + exc.read().decode())
            return exc.code

    _, one = admin(gw, "POST", "/admin/keys", {"name": "one", "rpm": 100, "tpm": 100000})
    _, two = admin(gw, "POST", "/admin/keys", {"name": "two", "models": ["fast"]})
    chat = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}
    assert call("POST", "/v1/chat/completions", chat, one["key"]) == 200
    assert call("POST", "/v1/chat/completions", {**chat, "stream": True}, two["key"]) == 200
    assert call("POST", "/v1/chat/completions", {**chat, "model": "wrong-key"}, one["key"]) == 502
    assert call("POST", "/v1/chat/completions", {**chat, "model": "wrong-key"}, two["key"]) == 403
    assert call("POST", "/v1/chat/completions", chat, one["key"] + "x") == 401
    assert call("POST", "/v1/chat/completions", chat, UPSTREAM_KEY) == 401
    assert call("POST", "/v1/chat/completions", {"model": "fast"}, one["key"]) == 400
    assert call("GET", "/admin/keys", key=one["key"]) == 403
    assert call("GET", "/v1/models", key=two["key"]) == 200
    admin(gw, "DELETE", f"/admin/keys/{two['id']}")
    assert call("POST", "/v1/chat/completions", chat, two["key"]) == 401
    for path in (
        "/admin/policy",
        "/admin/keys",
        "/admin/stats?since=5m",
        "/admin/costs",
        "/admin/dispatch",
        "/admin/replicas",
        "/admin/dashboard?since=5m",
        "/dashboard",
    ):
        assert call("GET", path, key=ADMIN_KEY) == 200, path
    call("GET", "/readyz")
    assert call("GET", "/metrics") == 200
    gw.wait_log(lambda line: line.get("event") == "request" and line.get("status") == 401)
    gw.stop()
    everything = "\n".join([*seen, gw.log_path.read_text()])
    assert "sim-fast" in everything and '"x-upstream-token":"<redacted>"' in everything
    secrets = [UPSTREAM_KEY, WRONG_UPSTREAM_KEY, HEADER_SECRET, ADMIN_KEY]
    for made in (one, two):
        secrets += [made["key"], made["key"].split("_", 1)[1]]
    for secret in secrets:
        assert secret not in everything, secret
