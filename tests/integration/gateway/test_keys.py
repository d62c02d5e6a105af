"""Virtual keys: the CLI and the admin API create, list and revoke them; the gateway checks them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from gateway.procutil import free_port
from tests.helpers import ROOT, GatewayProcess, SimServer, sim_policy

ADMIN_KEY = "adm-test-6f1c2d9e8b7a"
MESSAGES = [{"role": "user", "content": "hi"}]


def keys_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *args, "--redis-url", redis_url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )


def admin(gw: GatewayProcess, method: str, path: str, body: Any = None, key: str | None = ADMIN_KEY) -> Any:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(gw.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_revocation_reaches_another_replica_within_about_a_second(
    sim: SimServer, make_gateway: Any
) -> None:
    env = {"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY, "SWITCHYARD_KEY_CACHE_S": "300"}
    first = make_gateway(sim_policy(sim.base_url), env=env)
    second = make_gateway(sim_policy(sim.base_url), env=env, flush_redis=False)
    _, made = admin(first, "POST", "/admin/keys", {"name": "short-lived"})
    assert client(second, made["key"]).models.list().data  # now cached for 300 s on the second
    assert admin(first, "DELETE", f"/admin/keys/{made['id']}")[0] == 200
    t0 = time.monotonic()
    while True:
        try:
            client(second, made["key"]).models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() - t0 < 3, "the other replica still accepts the revoked key"
        time.sleep(0.1)


@pytest.fixture()
def keyed(sim: SimServer, make_gateway: Any) -> GatewayProcess:
    gw: GatewayProcess = make_gateway(
        sim_policy(sim.base_url),
        env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY, "SWITCHYARD_KEY_CACHE_S": "0.3"},
    )
    return gw


def client(gw: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=10)


def test_cli_key_works_once_created_and_only_a_salted_hash_is_stored(
    keyed: GatewayProcess, redis_url: str
) -> None:
    made = keys_cli(redis_url, "create", "--name", "team-a", "--rpm", "100", "--models", "fast,strong")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("sk-sy-") and len(secret) > 40
    assert "not shown again" in made.stderr

    reply = client(keyed, secret).chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
    assert reply.choices[0].message.content

    r = redis.Redis.from_url(redis_url)
    dump = b"".join(
        json.dumps({k.decode(): v.decode() for k, v in r.hgetall(k).items()}).encode()
        for k in r.scan_iter("sy:key:*")
    )
    key_secret = secret.split("_", 1)[1]
    assert key_secret.encode() not in dump and secret.encode() not in dump
    assert b'"salt"' in dump and b'"hash"' in dump

    listed = keys_cli(redis_url, "list")
    assert listed.returncode == 0 and "team-a" in listed.stdout and "active" in listed.stdout
    assert key_secret not in listed.stdout

    key_id = secret[len("sk-sy-") :].split("_", 1)[0]
    assert keys_cli(redis_url, "revoke", key_id).returncode == 0
    # Another process revoked it: this gateway notices within its key cache time (0.3 s here).
    deadline = time.monotonic() + 5
    while True:
        try:
            client(keyed, secret).chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
        except openai.AuthenticationError as exc:
            assert exc.code == "invalid_api_key" and "revoked" in exc.message
            break
        assert time.monotonic() < deadline, "revoked key still accepted"
        time.sleep(0.1)
    assert "revoked" in keys_cli(redis_url, "list").stdout


def test_missing_and_wrong_keys_are_401_in_openai_shape(keyed: GatewayProcess) -> None:
    req = urllib.request.Request(
        keyed.base_url + "/chat/completions",
        data=json.dumps({"model": "fast", "messages": MESSAGES}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(req, timeout=10)
    assert missing.value.code == 401
    body = json.loads(missing.value.read())
    assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"

    for wrong in ("sk-nonsense", "sk-sy-0123456789ab_" + "x" * 43, "Bearer"):
        with pytest.raises(openai.AuthenticationError) as info:
            client(keyed, wrong).chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(keyed, "wrong").models.list()
    # Ops endpoints stay open.
    with urllib.request.urlopen(keyed.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_admin_keys_api_needs_the_admin_key_and_never_shows_a_secret(keyed: GatewayProcess) -> None:
    assert admin(keyed, "POST", "/admin/keys", {"name": "x"}, key=None)[0] == 403
    status, body = admin(keyed, "POST", "/admin/keys", {"name": "x"}, key="not-the-admin-key")
    assert status == 403 and body["error"]["code"] == "invalid_admin_key"
    assert admin(keyed, "GET", "/admin/keys", key=None)[0] == 403
    assert admin(keyed, "DELETE", "/admin/keys/0123456789ab", key=None)[0] == 403

    status, bad = admin(keyed, "POST", "/admin/keys", {"name": "x", "rpm": "ten"})
    assert status == 400 and bad["error"]["param"] == "rpm"

    status, made = admin(keyed, "POST", "/admin/keys", {"name": "team-b", "tpm": 5000, "budget_usd": 2.5})
    assert status == 201 and made["key"].startswith("sk-sy-")
    assert made["tpm"] == 5000 and made["budget_usd"] == 2.5
    reply = client(keyed, made["key"]).chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert reply.choices

    status, listing = admin(keyed, "GET", "/admin/keys")
    assert status == 200
    row = next(r for r in listing["data"] if r["id"] == made["id"])
    assert row["name"] == "team-b" and row["revoked"] is False
    text = json.dumps(listing)
    assert made["key"] not in text and made["key"].split("_", 1)[1] not in text and '"hash"' not in text

    status, revoked = admin(keyed, "DELETE", f"/admin/keys/{made['id']}")
    assert status == 200 and revoked["revoked"] is True
    # Revoked on this replica: refused at once.
    with pytest.raises(openai.AuthenticationError):
        client(keyed, made["key"]).chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert admin(keyed, "DELETE", "/admin/keys/0123456789ab")[0] == 404


def test_a_key_limited_to_models_gets_403_for_others(keyed: GatewayProcess) -> None:
    _, made = admin(keyed, "POST", "/admin/keys", {"name": "fast-only", "models": ["fast"]})
    c = client(keyed, made["key"])
    assert c.chat.completions.create(model="fast", messages=MESSAGES).choices  # type: ignore[arg-type]
    with pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(model="strong", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 403 and info.value.code == "model_not_allowed"
    assert [m.id for m in c.models.list()] == ["fast"]


def _serve(tmp_path: Path, redis_url: str, *args: str) -> subprocess.Popen[bytes]:
    log = open(tmp_path / f"serve-{free_port()}.log", "wb")  # noqa: SIM115 - child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--redis-url", redis_url, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def test_no_auth_on_a_public_address_refuses_to_start_unless_forced(
    sim: SimServer, redis_url: str, tmp_path: Path
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(sim_policy(sim.base_url))
    refused = subprocess.run(
        [
            *(sys.executable, "-m", "gateway", "serve", "--host", "0.0.0.0", "--auth", "none"),
            *("--port", str(free_port()), "--policy", str(policy), "--redis-url", redis_url),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 2
    assert "--insecure-no-auth" in refused.stderr

    # Public address, no --auth: keys are required.
    port = free_port()
    proc = _serve(tmp_path, redis_url, "--host", "0.0.0.0", "--port", str(port), "--policy", str(policy))
    try:
        _wait_up(port, proc)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0).models.list()
    finally:
        proc.terminate()
        proc.wait(20)

    port = free_port()
    proc = _serve(
        tmp_path,
        redis_url,
        *("--host", "0.0.0.0", "--port", str(port), "--policy", str(policy)),
        *("--auth", "none", "--insecure-no-auth"),
    )
    try:
        _wait_up(port, proc)
        models = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0).models
        assert "fast" in [m.id for m in models.list()]
    finally:
        proc.terminate()
        proc.wait(20)


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    from gateway.procutil import wait_http_ok

    wait_http_ok(f"http://127.0.0.1:{port}/healthz", 30, proc)


def test_a_burst_of_checks_of_a_new_key_shares_one_lookup(redis_url: str) -> None:
    """A thousand requests of a key not yet verified, at once (the soak's 1,000 streams): one
    Redis lookup serves them all. Before, each did its own and the client's pool ran out of
    connections (MaxConnectionsError past 100), answering 503 auth_unavailable."""
    import asyncio

    from gateway.auth.keys import KeyStore
    from gateway.store import connect

    async def burst() -> list[str]:
        client = connect(redis_url)
        try:
            store = KeyStore(client)
            secret, _ = await store.create("burst")
            fresh = KeyStore(client)  # another replica: nothing cached
            results = await asyncio.gather(
                *(fresh.verify(secret) for _ in range(1000)), return_exceptions=True
            )
            return [r.key_id if not isinstance(r, BaseException) else repr(r) for r in results]
        finally:
            await client.aclose()

    ids = asyncio.run(burst())
    assert len(set(ids)) == 1 and not ids[0].startswith(("UpstreamUnavailable", "Authentication")), ids[:3]


def _hgetall_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


def test_a_flood_of_bogus_keys_does_not_evict_a_valid_one() -> None:
    """10,001 distinct made-up keys (past the cache's 10,000) each cost one Redis lookup; the
    valid key verified before them is still answered from memory: Redis's own count of HGETALL
    calls does not move. Before, the cache was cleared whole at 10,000 entries. The count is the
    whole server's, so the test has a Redis of its own (the other workers share the suite's)."""
    import asyncio
    import contextlib

    from gateway.auth.keys import KeyStore
    from gateway.errors import AuthenticationError
    from gateway.store import connect
    from gateway.store.embedded import EmbeddedRedis
    from gateway.store.gate import RedisGate

    with EmbeddedRedis() as server:
        redis_url = server.url
        counter = redis.Redis.from_url(redis_url)

        async def flood() -> tuple[int, int]:
            client = connect(redis_url)
            try:
                secret, _ = await KeyStore(client).create("flooded")
                # A generous bound: on a loaded machine a lookup may pass the default 50 ms.
                store = KeyStore(client, cache_s=600.0, gate=RedisGate(5.0))
                await store.verify(secret)
                for i in range(10_001):
                    with contextlib.suppress(AuthenticationError):
                        await store.verify(f"sk-sy-{i:012x}_bogus{i}")
                before = _hgetall_calls(counter)
                record = await store.verify(secret)
                assert record.name == "flooded"
                return before, _hgetall_calls(counter)
            finally:
                await client.aclose()

        try:
            before, after = asyncio.run(flood())
        finally:
            counter.close()
        assert after == before, f"the valid key was looked up again in Redis ({after - before} HGETALL)"
