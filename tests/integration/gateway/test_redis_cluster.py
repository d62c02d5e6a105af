"""Redis Cluster: a real three-node cluster (redis-server --cluster-enabled yes), the stats
pipelines spanning its slots, and the gateway counting into it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from redis.cluster import RedisCluster

from gateway.cachestats import Accounting
from gateway.cachestats.chain import CHECKPOINT_TOKENS
from gateway.cachestats.prefix import expect_shared
from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.procutil import free_port
from gateway.shaping.shaper import ShapeResult
from gateway.shaping.stability import StabilityModel
from gateway.store import connect, is_cluster_url
from gateway.store.embedded import find_redis_server
from gateway.store.writer import StatsWriter
from gateway.telemetry.record import finished_request
from tests.helpers import GatewayProcess, SimServer, http_json, sim_policy

SLOTS = 16384


# A fresh cluster client's first flush also discovers the slots and loads the scripts on
# every node: on a loaded CI machine that once took past the writer's production bound
# (0.5 s, then the batch is dropped), which these tests are not about.
FIRST_FLUSH_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Three masters, no replicas, every slot assigned (CLUSTER ADDSLOTS + MEET, as
    ``redis-cli --cluster create`` does)."""
    binary = find_redis_server()
    ports = [_cluster_port() for _ in range(3)]
    procs = []
    for port in ports:
        workdir = tmp_path_factory.mktemp(f"cluster-{port}")
        procs.append(
            subprocess.Popen(
                [
                    binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-config-file", str(workdir / "nodes.conf"), "--dir", str(workdir),
                    "--save", "", "--appendonly", "no", "--loglevel", "warning",
                ],
                stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
    try:
        clients = [redis.Redis(port=port) for port in ports]
        for client in clients:
            _wait(lambda c=client: _pings(c))
        bounds = [0, SLOTS // 3, 2 * SLOTS // 3, SLOTS]
        for i, client in enumerate(clients):
            client.execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
        for client in clients:
            _wait(lambda c=client: c.execute_command("CLUSTER INFO")["cluster_state"] == "ok", 30)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and below 65536 too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _wait(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "redis cluster did not come up"
        time.sleep(0.05)


def test_cluster_urls_are_recognised() -> None:
    assert is_cluster_url("redis+cluster://a:1,b:2")
    assert is_cluster_url("rediss+cluster://:pw@a:1")
    assert not is_cluster_url("redis://a:1") and not is_cluster_url("unix:///tmp/r.sock")
    with pytest.raises(ValueError, match="only database 0"):
        connect("redis+cluster://127.0.0.1:7000/3")
    with pytest.raises(ValueError, match="bad Redis Cluster node"):
        connect("redis+cluster://127.0.0.1:notaport")


def test_stats_pipelines_span_the_clusters_slots(cluster: list[int]) -> None:
    deployments = [f"dep-{i}" for i in range(12)]
    sync = RedisCluster(host="127.0.0.1", port=cluster[0])
    sync.flushall()

    policy = parse_policy(
        "deployments: {" + ", ".join(f"{d}: {{base_url: 'http://x'}}" for d in deployments) + "}\n"
        f"tiers: {{fast: [{deployments[0]}]}}\n",
        "p",
    )
    snapshot = PolicySnapshot(policy=policy, source="p", digest="d", version=1)

    async def main() -> dict[str, Any]:
        client = connect(f"redis+cluster://127.0.0.1:{cluster[1]},127.0.0.1:{cluster[2]}")
        writer = StatsWriter(client, timeout_s=FIRST_FLUSH_S)
        accounting = Accounting(writer, client)
        for i, name in enumerate(deployments):
            ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=snapshot)
            ctx.deployment, ctx.status = name, 200
            ctx.usage = {
                "prompt_tokens": 100,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 64},
            }
            ctx.shape = ShapeResult(template=f"tpl{i}", segments=[("tools", f"{i:08x}", "")])
            accounting.record(finished_request(ctx))
        await writer.flush()
        assert writer.written > 0 and writer.dropped == 0
        assert await client.ping()
        report = await accounting.report(policy, 3600)
        await client.aclose()
        return report

    report = asyncio.run(main())
    totals = report["deployments"]
    assert all(totals[name]["requests"] == 1 and totals[name]["cached_tokens"] == 64 for name in deployments)
    # The keys really live on different nodes: one pipeline crossed slots.
    nodes = {sync.get_node_from_key(key).port for key in sync.scan_iter("sy:*")}
    assert len(nodes) >= 2
    sync.close()


def test_cache_expectations_of_many_deployments_on_a_cluster(cluster: list[int]) -> None:
    """One script call per deployment: each keeps its keys in one slot, and the calls of
    one batch go to the nodes that own them."""
    deployments = [f"dep-{i}" for i in range(12)]
    sync = RedisCluster(host="127.0.0.1", port=cluster[0])
    sync.flushall()

    async def main() -> tuple[list[int], list[int]]:
        client = connect(f"redis+cluster://127.0.0.1:{cluster[1]}")
        try:
            batch = [(name, [i + 1, i + 2, i + 3], 60.0) for i, name in enumerate(deployments)]
            return await expect_shared(client, batch), await expect_shared(client, batch)
        finally:
            await client.aclose()

    first, second = asyncio.run(main())
    assert first == [0] * 12
    assert second == [3 * CHECKPOINT_TOKENS] * 12
    nodes = {sync.get_node_from_key(key).port for key in sync.scan_iter("sy:pfx:*")}
    assert len(nodes) >= 2
    sync.close()


def test_the_stability_model_loads_templates_from_every_node(cluster: list[int]) -> None:
    """One script call per template (its two hours share a hash tag), in one pipeline that
    the client splits per node."""
    templates = [f"tpl-{i}" for i in range(12)]
    sync = RedisCluster(host="127.0.0.1", port=cluster[0])
    sync.flushall()
    model = StabilityModel()

    async def main() -> None:
        client = connect(f"redis+cluster://127.0.0.1:{cluster[2]}")
        writer = StatsWriter(client, timeout_s=FIRST_FLUSH_S)
        try:
            for name in templates:
                for _ in range(3):
                    model.observe(name, ["stable", name], writer)
            await writer.flush()
            assert writer.dropped == 0
            fresh = StabilityModel()
            for name in templates:
                fresh.observe(name, [], None)
            await fresh._load(client, templates)
            assert [fresh.verdicts(n, ["stable", n, "other"], 3, 1.0) for n in templates] == [
                [True, True, False]
            ] * len(templates)
        finally:
            await client.aclose()

    asyncio.run(main())
    nodes = {sync.get_node_from_key(key).port for key in sync.scan_iter("sy:stab:*")}
    assert len(nodes) >= 2
    sync.close()


def test_the_gateway_counts_into_a_redis_cluster(cluster: list[int], tmp_path: Path, sim: SimServer) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster[0]}"
    gw = GatewayProcess(sim_policy(sim.base_url), redis_url=url, workdir=tmp_path, flush_redis=False).start()
    try:
        assert http_json("GET", gw.url + "/readyz")["redis"] is True
        with openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0) as c:
            for _ in range(3):
                c.chat.completions.create(model="sim-strong", messages=[{"role": "user", "content": "hi"}])
        deadline = time.monotonic() + 10
        while True:
            stats = http_json("GET", gw.url + "/admin/stats?since=5m")
            if stats["deployments"]["sim-strong"]["requests"] >= 3:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.1)
        assert stats["stats_writes"]["dropped"] == 0
    finally:
        gw.stop()


def test_keys_rate_limits_and_spend_work_on_a_cluster(cluster: list[int]) -> None:
    """The limiter's Lua script and the charge in the stats pipeline need the key's three
    Redis keys in one slot: their hash tag puts them there."""
    from gateway.auth.keys import KeyStore
    from gateway.auth.limits import Limiter
    from gateway.errors import RateLimitError

    async def main() -> tuple[int, float, int]:
        client = connect(f"redis+cluster://127.0.0.1:{cluster[0]}")
        writer = StatsWriter(client, timeout_s=FIRST_FLUSH_S)
        store, limiter = KeyStore(client), Limiter(client, writer)
        secret, _ = await store.create("clustered", rpm=3, tpm=1000)
        key = await KeyStore(client).verify(secret)
        admitted = 0
        for _ in range(5):
            try:
                await limiter.admit(key)
                admitted += 1
            except RateLimitError:
                pass
        limiter.charge(key, 50, 123_000_000)
        await writer.flush()
        spend = (await limiter.spend_usd([key.key_id]))[key.key_id]
        errors = limiter.errors + writer.dropped
        await client.aclose()
        return admitted, spend, errors

    admitted, spend, errors = asyncio.run(main())
    assert admitted == 3 and spend == 0.123 and errors == 0
