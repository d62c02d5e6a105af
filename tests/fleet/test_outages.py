"""Outages: a simulator host cut off (its prefixes move to the other and come back), a
gateway host cut off (the others carry on; the fleet view shows it gone, then back), and a
Redis master killed mid-run (failover to its replica: no request fails, limits fail open
for the failover's length, with a log line and a metric)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
import urllib.error

import pytest
from redis.cluster import RedisCluster

from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import FleetBed, admin, http
from gateway.tools.fleet.load import LoadResult, chat_body, run_load

pytestmark = pytest.mark.fleet

PREFIXES = [f"You are outage assistant {i}. " + "Answer in the house style. " * 20 for i in range(8)]


def homes(bed: FleetBed, result: LoadResult, cut: int | None = None) -> dict[int, set[int]]:
    return checks.served_by(bed, result, len(PREFIXES), cut)


def burst(bed: FleetBed, key: str, tag: str, seconds: float = 2.0) -> LoadResult:
    gateways = [g.url for g in bed.gateways]
    body = lambda i: chat_body(PREFIXES[i % len(PREFIXES)], f"{tag} {i}")  # noqa: E731
    return asyncio.run(run_load(lambda: gateways, key, body, rate_per_s=8, duration_s=seconds, tag=tag))


def wait(predicate, timeout_s: float, what: str) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, what
        time.sleep(0.1)
    return time.monotonic() - start


def _ready(url: str) -> bool:
    try:
        return bool(http("GET", url + "/readyz")["status"] == "ready")
    except urllib.error.HTTPError:  # 503 while not ready
        return False


def test_a_cut_simulator_hosts_prefixes_move_and_come_back(bed: FleetBed) -> None:
    if not bed.topology.isolated:
        pytest.skip("cutting a host's link needs network namespaces (the bed runs on loopback here)")
    key = bed.create_key("sim-cut")
    before = homes(bed, burst(bed, key, "before"))
    assert all(len(h) == 1 for h in before.values())
    on_s1 = [p for p, h in before.items() if h == {0}]
    assert on_s1
    cut = bed.sims[0]
    bed.topology.cut(cut.host)
    try:
        # The gateways' health checks (every 0.5 s) find it gone.
        detected = wait(
            lambda: all(admin(g.url, "/admin/replicas")["deployments"]["local"]["healthy_replicas"] == 1
                        for g in bed.gateways), 15, "the cut simulator is noticed")  # fmt: skip
        during = burst(bed, key, "during")
        assert not during.failed
        moved = homes(bed, during, cut=0)
        assert all(moved[p] == {1} for p in on_s1), dict(moved)
    finally:
        bed.topology.restore(cut.host)
    back = wait(
        lambda: all(admin(g.url, "/admin/replicas")["deployments"]["local"]["healthy_replicas"] == 2
                    for g in bed.gateways), 15, "the simulator is back")  # fmt: skip
    after = homes(bed, burst(bed, key, "after"))
    assert all(after[p] == {0} for p in on_s1), dict(after)
    print(f"simulator cut: noticed by every gateway in {detected:.1f} s, {len(on_s1)} prefixes moved, "
          f"back home {back:.1f} s after the link returned")  # fmt: skip


def test_a_cut_gateway_host_leaves_the_others_serving(bed: FleetBed) -> None:
    if not bed.topology.isolated:
        pytest.skip("cutting a host's link needs network namespaces (the bed runs on loopback here)")
    key = bed.create_key("gw-cut")
    lost = bed.gateways[2]
    others = [g.url for g in bed.gateways[:2]]
    bed.topology.cut(lost.host)
    try:
        gone = wait(lambda: admin(others[0], "/admin/fleet")["live"] == 2, 10, "the fleet view drops it")
        body = lambda i: chat_body(PREFIXES[i % len(PREFIXES)], f"cut {i}")  # noqa: E731
        during = asyncio.run(run_load(lambda: others, key, body, rate_per_s=8, duration_s=3, tag="gwcut"))
        assert not during.failed and during.admitted == len(during.outcomes)
    finally:
        bed.topology.restore(lost.host)
    back = wait(lambda: admin(others[0], "/admin/fleet")["live"] == 3, 15, "it is back in the fleet view")
    # Its heartbeat is back; its own view of the simulators returns with their next /health
    # probe (every health_interval_s, 2 s): it serves again within a few probes, unaided.
    ready = wait(lambda: _ready(lost.url), 10, "it is ready again")
    print(f"gateway cut: the others served {len(during.outcomes)} requests, none failed; shown gone after "
          f"{gone:.1f} s, back {back:.1f} s after the link returned, ready {ready:.1f} s later")  # fmt: skip


def test_killing_a_redis_master_mid_run_fails_no_request(bed: FleetBed) -> None:
    key = bed.create_key("failover", rpm=100_000)
    key_id = next(
        k["id"] for k in admin(bed.gateways[0].url, "/admin/keys")["data"] if k["name"] == "failover"
    )
    first = bed.redis[0]
    cluster = RedisCluster(host=first.host.address, port=first.port)
    owner = cluster.get_node_from_key(f"sy:rl:{{{key_id}}}:req")
    cluster.close()
    victim = next(n for n in bed.redis if (n.host.address, n.port) == (owner.host, owner.port))
    survivor = next(n for n in bed.redis if n is not victim)
    gateways = [g.url for g in bed.gateways]
    killed: list[float] = []

    async def main() -> LoadResult:
        async def kill() -> None:
            await asyncio.sleep(2.0)
            killed.append(time.monotonic())
            victim.send(signal.SIGKILL)

        killer = asyncio.create_task(kill())
        body = lambda i: chat_body(PREFIXES[i % len(PREFIXES)], f"failover {i}")  # noqa: E731
        result = await run_load(lambda: gateways, key, body, rate_per_s=10, duration_s=10, tag="failover")
        await killer
        return result

    result = asyncio.run(main())
    victim.wait(5)
    unchecked = [o for o in result.outcomes if o.ok and not o.limit_checked]
    window = (max(o.started for o in unchecked) - min(o.started for o in unchecked)) if unchecked else 0.0
    metrics = [http_text(g.url + "/metrics") for g in bed.gateways]
    fail_open = sum(_metric(m, "switchyard_rate_limit_fail_open_total") for m in metrics)
    logged = sum("rate_limit_unavailable" in g.log_path.read_text() for g in bed.gateways)
    print(f"redis master killed: {len(result.outcomes)} requests, {len(result.failed)} failed; "
          f"{len(unchecked)} admitted unchecked over {window:.1f} s; fail-open metric {fail_open:g}; "
          f"{logged} gateways logged rate_limit_unavailable")  # fmt: skip
    assert not result.failed, [(o.status, o.error) for o in result.failed[:5]]
    assert unchecked and fail_open >= len(unchecked) and logged >= 1
    # Fail-open lasts as long as the failover: cluster-node-timeout (1 s in the bed) + election.
    assert window < 8.0
    # Limits are checked again once the replica took over (the last requests were checked).
    assert all(o.limit_checked for o in result.outcomes[-10:])
    # The killed node comes back as a replica of its former replica.
    victim.start()
    wait(lambda: "cluster_state:ok" in bed._redis_cli(survivor, "cluster", "info"), 20, "cluster ok")


def http_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0
