"""A web page cannot drive a gateway through its user's browser: JSON endpoints take only a
JSON ``Content-Type`` (415 otherwise, in the endpoint's own error format), and a gateway with
no keys refuses requests from foreign origins (403 ``origin_not_allowed``) unless listed in
``SWITCHYARD_ALLOWED_ORIGINS``; the SDKs (which send no ``Origin``) are unaffected."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
ADMIN_KEY = "adm-browser-3c9e1f"


def post(
    url: str, body: Any, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    # urllib adds a form Content-Type to any body unless told otherwise: say "none" by omission.
    if data is not None and "Content-Type" not in headers:
        req.remove_header("Content-type")
        req.unredirected_hdrs.pop("Content-type", None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, dict(resp.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, dict(exc.headers), json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def open_gateway(sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    gw = GatewayProcess(sim_policy(sim.base_url), redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw"))
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_declared_json_is_415_in_each_dialect(
    open_gateway: GatewayProcess, sim: SimServer, content_type: str | None
) -> None:
    sim.reset()
    headers = {"Content-Type": content_type} if content_type else {}
    status, _, body = post(open_gateway.base_url + "/chat/completions", CHAT, headers)
    assert status == 415, body
    assert body["error"]["code"] == "unsupported_media_type"
    assert "application/json" in body["error"]["message"]
    status, _, body = post(open_gateway.base_url + "/messages", CHAT, headers)
    assert status == 415, body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert sim.stats()["requests_total"] == 0, "the upstream was called"


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_content_types_are_accepted(open_gateway: GatewayProcess, content_type: str) -> None:
    status, _, body = post(open_gateway.base_url + "/chat/completions", CHAT, {"Content-Type": content_type})
    assert status == 200, body


def test_the_official_sdks_are_accepted(open_gateway: GatewayProcess) -> None:
    oa = openai.OpenAI(base_url=open_gateway.base_url, api_key="unused", max_retries=0)
    assert oa.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}]).choices
    an = anthropic.Anthropic(base_url=open_gateway.url, api_key="unused", max_retries=0)
    assert an.messages.create(
        model="fast", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ).content


def test_a_keyless_gateway_refuses_foreign_origins_and_serves_its_own(
    open_gateway: GatewayProcess, sim: SimServer
) -> None:
    sim.reset()
    url = open_gateway.base_url + "/chat/completions"
    json_type = {"Content-Type": "application/json"}
    for origin in ("https://evil.example", "null", f"http://evil.example:{open_gateway.port}"):
        status, headers, body = post(url, CHAT, {**json_type, "Origin": origin})
        assert status == 403 and body["error"]["code"] == "origin_not_allowed", (origin, body)
        assert "Access-Control-Allow-Origin" not in headers
    status, _, body = post(
        open_gateway.url + "/v1/messages", CHAT, {**json_type, "Origin": "https://evil.example"}
    )
    assert status == 403 and body["error"]["type"] == "permission_error", body
    # The admin API is open on a loopback bind without an admin key: the same check guards it.
    status, _, body = post(open_gateway.url + "/admin/reload", None, {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    assert sim.stats()["requests_total"] == 0
    # The gateway's own page (its dashboard), and programs that send no Origin.
    own = f"http://127.0.0.1:{open_gateway.port}"
    assert post(url, CHAT, {**json_type, "Origin": own})[0] == 200
    assert post(url, CHAT, json_type)[0] == 200


def test_a_listed_origin_gets_cors_answers(make_gateway: Any, sim: SimServer) -> None:
    app = "http://app.localhost:3000"
    gw = make_gateway(
        sim_policy(sim.base_url), env={"SWITCHYARD_ALLOWED_ORIGINS": f"{app}/, https://other.example"}
    )
    url = gw.base_url + "/chat/completions"
    status, headers, _ = post(
        url,
        None,
        {
            "Origin": app,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
        method="OPTIONS",
    )
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == app
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "content-type"
    status, headers, body = post(url, CHAT, {"Content-Type": "application/json", "Origin": app})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == app, body
    assert "x-request-id" in headers["Access-Control-Expose-Headers"]
    assert post(url, CHAT, {"Content-Type": "application/json", "Origin": "https://evil.example"})[0] == 403


def test_a_keyed_gateway_leaves_the_origin_to_the_key(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(
        sim_policy(sim.base_url), env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
    )
    status, _, created = post(
        gw.url + "/admin/keys",
        {"name": "web"},
        {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {ADMIN_KEY}",
            "Origin": "https://x.example",
        },
    )
    assert status == 201, created
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {created['key']}"}
    assert post(gw.base_url + "/chat/completions", CHAT, {**headers, "Origin": "https://x.example"})[0] == 200
    status, _, body = post(gw.base_url + "/chat/completions", CHAT, {**headers, "Content-Type": "text/plain"})
    assert status == 415, body
