"""Several gateways sharing one Redis: each lists the others in ``/admin/fleet`` from their
heartbeats, and ``switchyard policy push`` reaches every gateway that follows Redis within
its reload interval (``/readyz`` shows the digest)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from gateway.store import connect
from gateway.store.fleet import FLEET_KEY, LIVE_BEATS, fleet_report
from tests.helpers import ROOT, GatewayProcess, SimServer, http_json, sim_policy

FOLLOW = {"SWITCHYARD_HEARTBEAT_S": "0.2", "SWITCHYARD_POLICY_FROM_REDIS": "1"}


def fleet(gw: GatewayProcess) -> dict[str, Any]:
    body: dict[str, Any] = http_json("GET", gw.url + "/admin/fleet")
    return body


def wait_until(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def answered_by(gw: GatewayProcess, model: str) -> str:
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]})
    req = urllib.request.Request(
        gw.base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(resp.headers["x-switchyard-model"])


def push(redis_url: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "push", str(path), "--redis-url", redis_url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_every_gateway_lists_the_live_fleet(make_gateway: Any, sim: SimServer) -> None:
    a = make_gateway(sim_policy(sim.base_url), env=FOLLOW)
    b = make_gateway(sim_policy(sim.base_url), env=FOLLOW, flush_redis=False)
    http_json(
        "POST",
        b.base_url + "/chat/completions",
        {"model": "sim-fast", "messages": [{"role": "user", "content": "hi"}]},
    )
    seen = wait_until(
        lambda: (
            (f := fleet(a))["live"] == 2
            and f["gateways"][0]["requests"] + f["gateways"][1]["requests"] == 1
            and f
        )
    )
    ports = sorted(g["address"].rsplit(":", 1)[1] for g in seen["gateways"])
    assert ports == sorted([str(a.port), str(b.port)])
    for beat in seen["gateways"]:
        assert beat["version"] and beat["uptime_s"] >= 0 and beat["in_flight"] == 0
        assert beat["policy_digest"] == http_json("GET", a.url + "/readyz")["policy"]["digest"]
    assert seen["self"] != fleet(b)["self"]
    assert {g["id"] for g in fleet(b)["gateways"]} == {g["id"] for g in seen["gateways"]}
    # A stopped gateway leaves the roll call at once.
    b.stop()
    gone = wait_until(lambda: (f := fleet(a))["live"] == 1 and len(f["gateways"]) == 1 and f, 5)
    assert gone["gateways"][0]["address"].endswith(f":{a.port}")


def test_a_gateway_that_stops_beating_is_shown_gone_then_forgotten(redis_url: str) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], int]:
        redis = connect(redis_url)
        await redis.delete(FLEET_KEY)
        beat = {"id": "h/1", "address": "h:1", "policy_digest": "d", "in_flight": 2, "seen_at": 1000.0,
                "started_at": 900.0, "interval_s": 1.0}  # fmt: skip
        await redis.hset(FLEET_KEY, "h/1", orjson.dumps(beat))
        live = await fleet_report(redis, now=1000.0 + LIVE_BEATS)
        late = await fleet_report(redis, now=1000.0 + LIVE_BEATS + 0.5)
        await fleet_report(redis, now=1000.0 + 100)
        left = await redis.hlen(FLEET_KEY)
        await redis.aclose()
        return live, late, left

    live, late, left = asyncio.run(main())
    assert live["live"] == 1 and live["in_flight"] == 2 and live["policies"] == {"d": 1}
    assert late["live"] == 0 and late["gateways"][0]["live"] is False and late["in_flight"] == 0
    assert left == 0


def test_a_pushed_policy_reaches_every_follower_within_the_reload_interval(
    make_gateway: Any, sim: SimServer, redis_url: str, tmp_path: Path
) -> None:
    gws = [make_gateway(sim_policy(sim.base_url), env=FOLLOW, flush_redis=i == 0) for i in range(2)]
    before = {http_json("GET", gw.url + "/readyz")["policy"]["digest"] for gw in gws}
    assert len(before) == 1
    edited = tmp_path / "edited.yaml"
    # The edit: the fast tier is served by sim-strong.
    edited.write_text(sim_policy(sim.base_url).replace("fast: [sim-fast]", "fast: [sim-strong]"))
    done = push(redis_url, edited)
    pushed_at = time.monotonic()
    assert done.returncode == 0, done.stderr
    digest = done.stdout.split("digest ")[1].split()[0]
    assert digest not in before

    def all_follow() -> bool:
        return all(http_json("GET", gw.url + "/readyz")["policy"]["digest"] == digest for gw in gws)

    wait_until(all_follow, 5)
    # The reload interval is 0.2 s (tests/helpers.py): every gateway swapped within it and
    # a loaded machine's slack.
    assert time.monotonic() - pushed_at < 0.2 + 1.5
    status = http_json("GET", gws[1].url + "/readyz")["policy"]
    assert status["origin"] == "redis" and "edited.yaml" in status["source"]
    wait_until(lambda: fleet(gws[0])["policies"] == {digest: 2}, 5)
    # The edit is in force on every gateway.
    for gw in gws:
        assert answered_by(gw, "fast") == "sim-strong"
    # A gateway started later serves the pushed policy from its first request.
    late = make_gateway(sim_policy(sim.base_url), env=FOLLOW, flush_redis=False)
    assert http_json("GET", late.url + "/readyz")["policy"]["digest"] == digest


def test_an_invalid_policy_is_not_pushed(redis_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: {a: {base_url: 3}}\ntiers: {fast: [nope]}\n")
    done = push(redis_url, bad)
    assert done.returncode == 1 and "nothing pushed" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "push", str(bad)],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0
