"""Header values that are not UTF-8, and template names that would corrupt the stats: a
clear error or a plain answer, never a 500, and the stats writer keeps writing."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

from tests.helpers import GatewayProcess, SimServer, sim_policy
from tests.integration.gateway.test_errors import assert_openai_error
from tests.integration.gateway.test_keys import ADMIN_KEY, admin
from tests.integration.shaping.test_shaping_stats import stats

CHAT = {
    "model": "fast",
    "messages": [
        {"role": "system", "content": "You answer questions about trains.\nBe brief."},
        {"role": "user", "content": "hi"},
    ],
}


def send(
    gw: GatewayProcess, headers: bytes, body: Any = CHAT, path: str = "/v1/chat/completions"
) -> tuple[int, Any]:
    """POST with raw header bytes (an HTTP client would refuse to send these)."""
    url = urlsplit(gw.url)
    data = json.dumps(body).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + headers
            + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_bad_bytes_and_bad_template_names_are_clear_errors_and_stats_go_on(
    sim: SimServer, make_gateway: Any
) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    # Without virtual keys a bearer token only names the client on the dashboard.
    assert send(gw, b"Authorization: Bearer sk-\xff\xfe\r\n")[0] == 200
    assert send(gw, b"x-api-key: key-\xff\r\n")[0] == 200
    for header in (b"x-switchyard-template: caf\xe9\r\n", b"x-switchyard-template: a|b\r\n"):
        status, body = send(gw, header)
        assert status == 400, header
        error = assert_openai_error(body)
        assert (error["param"], error["code"]) == ("x-switchyard-template", "invalid_template")
    status, body = send(gw, b"", {**CHAT, "metadata": {"switchyard_template": "x" * 201}})
    assert status == 400 and assert_openai_error(body)["param"] == "metadata.switchyard_template"
    # A name in UTF-8 is a name.
    assert send(gw, "x-switchyard-template: café-v2\r\n".encode())[0] == 200
    report = stats(gw, lambda r: r["totals"]["requests"] >= 3)
    assert report["totals"]["requests"] == 3
    assert "café-v2" in {t["template"] for t in report["templates"]}
    assert report["stats_writes"]["dropped"] == 0 and report["stats_writes"]["written"] > 0


def test_bad_bytes_in_keys_are_refused_as_keys(sim: SimServer, make_gateway: Any) -> None:
    gw = make_gateway(
        sim_policy(sim.base_url), env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
    )
    _, made = admin(gw, "POST", "/admin/keys", {"name": "real"})
    key_id = made["key"].partition("_")[0]  # a key that exists, with a secret of other bytes
    status, body = send(gw, f"Authorization: Bearer {key_id}_".encode() + b"s\xffcret\r\n")
    assert status == 401 and assert_openai_error(body)["code"] == "invalid_api_key"
    status, body = send(gw, b"Authorization: Bearer \xff\r\n", {"name": "k"}, "/admin/keys")
    assert status == 403 and assert_openai_error(body)["code"] == "invalid_admin_key"
