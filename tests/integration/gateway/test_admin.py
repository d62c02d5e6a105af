"""The admin API behind its key: every ``/admin`` URL refuses a client without the admin key
with the same 403 body, accepts the key with the scheme in any case, and keeps the
router's 404 and 405 answers; ``/dashboard`` (the page) stays public."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.helpers import GatewayProcess, SimServer, sim_policy

ADMIN_KEY = "adm-test-5e0b1c7d9a2f"
ADMIN_GETS = (
    "/admin/policy",
    "/admin/stats?since=5m",
    "/admin/dashboard?since=5m",
    "/admin/replicas",
    "/admin/fleet",
    "/admin/dispatch",
    "/admin/keys",
    "/admin/costs",
    "/admin/routing/drift",
)


def call(gw: GatewayProcess, method: str, path: str, authorization: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    data = b"{}" if method == "POST" else None
    req = urllib.request.Request(gw.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if resp.headers["Content-Type"].startswith(
                "application/json"
            ) else body
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def gw(sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    gateway = GatewayProcess(
        sim_policy(sim.base_url),
        redis_url=redis_url,
        workdir=tmp_path_factory.mktemp("admin"),
        env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY},
    ).start()
    yield gateway
    gateway.stop()


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_admin_key_works_with_the_scheme_in_any_case(gw: GatewayProcess, scheme: str) -> None:
    for path in ADMIN_GETS:
        status, _ = call(gw, "GET", path, f"{scheme} {ADMIN_KEY}")
        assert status == 200, path


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {ADMIN_KEY}", ADMIN_KEY])
def test_every_admin_url_refuses_a_client_without_the_key(
    gw: GatewayProcess, authorization: str | None
) -> None:
    for method, path in [
        *(("GET", p) for p in ADMIN_GETS),
        ("POST", "/admin/reload"),
        ("POST", "/admin/keys"),
        ("DELETE", "/admin/keys/0123456789ab"),
    ]:
        status, body = call(gw, method, path, authorization)
        assert status == 403, path
        assert body == {
            "error": {
                "message": "Admin API needs the admin key.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_admin_key",
            }
        }, path


def test_unknown_admin_paths_and_methods_keep_the_router_answers(gw: GatewayProcess) -> None:
    status, body = call(gw, "GET", "/admin/nothing-here")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = call(gw, "POST", "/admin/policy")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    status, body = call(gw, "POST", "/admin/policy", f"Bearer {ADMIN_KEY}")
    assert status == 405


def test_the_dashboard_page_is_public_and_its_data_is_not(gw: GatewayProcess) -> None:
    status, page = call(gw, "GET", "/dashboard")
    assert status == 200 and b"/admin/dashboard" in page
    assert call(gw, "GET", "/admin/dashboard")[0] == 403


def test_an_unknown_key_id_is_a_404_for_the_admin(gw: GatewayProcess) -> None:
    status, body = call(gw, "DELETE", "/admin/keys/0123456789ab", f"bearer {ADMIN_KEY}")
    assert status == 404 and body["error"]["code"] == "key_not_found"
