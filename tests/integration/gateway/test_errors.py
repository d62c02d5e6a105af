"""Every error status of the contract, as the official SDK sees it (its own typed exceptions)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.procutil import free_port
from tests.helpers import GatewayProcess, SimServer

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    policy = f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim.base_url}"}}
  sim-hang:
    provider: vllm
    base_url: "{sim.base_url}"
    model: sim-fast
    timeouts: {{first_token_s: 0.5, total_s: 1}}
  dead: {{base_url: "{dead}"}}
tiers:
  fast: [sim-fast]
# One attempt each: these tests check how a single failure reaches the client.
dispatch: {{retries: {{max: 0}}}}
"""
    gw = GatewayProcess(
        policy,
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("gw"),
        env={"SWITCHYARD_MAX_BODY_BYTES": "65536"},
    )
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess, sim: SimServer) -> openai.OpenAI:
    sim.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=10)


def raw_post(
    url: str, data: bytes, content_type: str = "application/json"
) -> tuple[int, dict[str, Any], Any]:
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def assert_openai_error(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def test_malformed_json_is_400(gateway: GatewayProcess) -> None:
    status, headers, body = raw_post(
        gateway.base_url + "/chat/completions", b'{"model": "fast", "messages": ['
    )
    assert status == 400
    assert assert_openai_error(body)["code"] == "invalid_json"
    assert headers["x-request-id"]


def test_non_object_json_is_400(gateway: GatewayProcess) -> None:
    status, _, body = raw_post(gateway.base_url + "/chat/completions", b"[1, 2]")
    assert status == 400
    assert_openai_error(body)


def test_wrong_type_is_bad_request_naming_the_param(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fast", messages=[{"role": "wizard", "content": "x"}])  # type: ignore[misc,list-item]
    assert info.value.status_code == 400
    assert info.value.param == "messages[0].role"  # type: ignore[attr-defined]


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"
    assert "gpt-9" in info.value.message


def test_unknown_path_and_wrong_method(gateway: GatewayProcess) -> None:
    status, _, body = raw_post(gateway.base_url + "/nope", b"{}")
    assert status == 404
    assert_openai_error(body)
    req = urllib.request.Request(gateway.base_url + "/chat/completions", method="GET")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 405
    assert_openai_error(json.loads(info.value.read()))


def test_body_over_the_limit_is_413(gateway: GatewayProcess) -> None:
    big = json.dumps({"model": "fast", "messages": [{"role": "user", "content": "x" * 70000}]}).encode()
    status, _, body = raw_post(gateway.base_url + "/chat/completions", big)
    assert status == 413
    assert assert_openai_error(body)["code"] == "request_too_large"


def test_upstream_429_is_rate_limit_with_retry_after(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "rate_limit=7", count=1)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="fast", messages=MESSAGES)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "7"


def test_upstream_500_is_502(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "error=500", count=1)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="fast", messages=MESSAGES)
    assert info.value.status_code == 502
    assert info.value.response.headers["x-switchyard-model"] == "sim-fast"


def test_upstream_503_is_503(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "error=503", count=1)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="fast", messages=MESSAGES)
    assert info.value.status_code == 503


def test_upstream_client_error_is_relayed(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "context_length", count=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fast", messages=MESSAGES)
    assert info.value.code == "context_length_exceeded"


def test_unreachable_upstream_is_502(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="dead", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 502
    assert info.value.code == "connect_failed"


def test_stream_with_no_first_token_is_504(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "hang", count=1)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="sim-hang",
            messages=MESSAGES,
            stream=True,  # type: ignore[arg-type]
        )
    assert info.value.status_code == 504
    assert info.value.code == "first_token_timeout"


def test_non_stream_past_total_timeout_is_504(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "hang", count=1)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="sim-hang", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 504
    assert info.value.code == "total_timeout"


def test_stream_cut_mid_answer_ends_with_an_error_event(client: openai.OpenAI, sim: SimServer) -> None:
    sim.set_fault("sim-fast", "reset_mid_stream=3", count=1)
    stream = client.chat.completions.create(model="fast", messages=MESSAGES, stream=True, max_tokens=30)
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            received.append(chunk)
    assert received, "the first chunks were forwarded before the cut"
    # A plain message; the exception text and the deployment stay in the log (see below).
    assert info.value.message in (
        "The connection to the upstream broke.",
        "The upstream ended the stream before it finished.",
    )


def _request_line(gateway: GatewayProcess, request_id: str) -> dict[str, Any]:
    return gateway.wait_log(
        lambda line: line.get("event") == "request" and line.get("request_id") == request_id
    )


@pytest.mark.parametrize(
    ("model", "fault", "code"),
    [
        ("dead", None, "connect_failed"),
        ("fast", "error=500", "upstream_error"),
        ("fast", "reset_mid_stream=0", "upstream_disconnected"),
    ],
)
def test_upstream_failures_reach_the_client_as_a_code_and_a_plain_message(
    client: openai.OpenAI, gateway: GatewayProcess, sim: SimServer, model: str, fault: str | None, code: str
) -> None:
    """No exception text (``ClientConnectorError``, ``ConnectionResetError(104 ...)``), no
    upstream answer and no deployment name reach the client; the log line keeps them."""
    if fault:
        sim.set_fault("sim-fast", fault, count=1)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=model, messages=MESSAGES)  # type: ignore[arg-type]
    err = info.value
    assert err.code == code
    message = err.body["message"]  # type: ignore[index]
    for leak in ("sim-fast", "dead", "deployment", "Error", "errno", "127.0.0.1", "HTTP 500:"):
        assert leak not in message, (leak, message)
    assert message.startswith("The upstream") or message.startswith("The connection")
    line = _request_line(gateway, err.response.headers["x-request-id"])
    assert line["error_code"] == code
    assert f"deployment '{model if model == 'dead' else 'sim-fast'}'" in line["error_detail"]


def test_a_policy_switch_names_the_deployment_for_trusted_callers(make_gateway: Any, sim: SimServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    policy = f"""
deployments:
  dead: {{base_url: "{dead}"}}
tiers: {{fast: [dead]}}
dispatch: {{retries: {{max: 0}}}}
errors: {{expose_deployments: true}}
"""
    gw = make_gateway(policy)
    sdk = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        sdk.chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.body["message"] == "The upstream could not be reached. Deployment: 'dead'."  # type: ignore[index]
