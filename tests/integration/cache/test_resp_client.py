"""The response cache's own Redis client (gateway/store/resp.py) against real redis-server
children of this test's own: the URL's password and database as redis-py reads them, values
of any bytes and size, many commands on one connection, and a killed or frozen server costing
a command at most the gate's bound."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import ResponseError

from gateway.procutil import free_port
from gateway.store.embedded import EmbeddedRedis, find_redis_server
from gateway.store.gate import REDIS_FAULTS, RedisGate
from gateway.store.resp import RespClient, fast_client

PASSWORD = "s3cret-pw"


class Server:
    """A redis-server child on a TCP port, with a password."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0, password: str = PASSWORD) -> str:
        return f"redis://:{password}@127.0.0.1:{self.port}/{db}"

    def start(self) -> Server:
        self.proc = subprocess.Popen(
            [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url()).ping()
                return self
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path).start()
    try:
        yield srv
    finally:
        srv.kill()


def client_for(url: str, timeout_s: float = 2.0) -> RespClient:
    client = fast_client(url, RedisGate(timeout_s))
    assert client is not None
    return client


def test_get_set_delete_use_the_urls_password_and_database(server: Server) -> None:
    async def run() -> tuple[bytes | None, bytes | None, bytes | None]:
        client = client_for(server.url(db=3))
        client.set("k", b"value", 60_000)
        got = await client.get("k")
        missing = await client.get("no-such-key")
        client.delete("k")
        gone = await client.get("k")
        client.set("kept", b"in db 3", 60_000)
        await client.sync()
        client.close()
        return got, missing, gone

    got, missing, gone = asyncio.run(run())
    assert (got, missing, gone) == (b"value", None, None)
    # Written where redis-py, given the same URL, reads; with the TTL asked for.
    r3 = redis.Redis.from_url(server.url(db=3))
    assert r3.get("kept") == b"in db 3" and 0 < r3.pttl("kept") <= 60_000
    assert redis.Redis.from_url(server.url(db=0)).get("kept") is None


def test_a_unix_socket_url_is_spoken_and_tls_or_cluster_urls_are_left_to_redis_py() -> None:
    with EmbeddedRedis(supervise=False) as embedded:

        async def run() -> bytes | None:
            client = client_for(embedded.url)
            client.set("over-unix", b"yes", 10_000)
            got = await client.get("over-unix")
            client.close()
            return got

        assert asyncio.run(run()) == b"yes"
    gate = RedisGate()
    assert fast_client("rediss://127.0.0.1:6380/0", gate) is None
    assert fast_client("redis+cluster://127.0.0.1:7000", gate) is None


def test_values_of_any_bytes_and_size_and_many_commands_share_one_connection(server: Server) -> None:
    big = os.urandom(700_000)  # many reads: the reply arrives in pieces
    tricky = b"line\r\n$5\r\n-ERR not an error\r\n:1\r\n" * 3

    async def run() -> tuple[list[bytes | None], int]:
        client = client_for(server.url(), timeout_s=2.0)
        client.set("big", big, 60_000)
        client.set("tricky", tricky, 60_000)
        for i in range(300):
            client.set(f"n{i}", str(i).encode(), 60_000)
        keys = ["big", "tricky", *(f"n{i}" for i in range(300)), "absent"]
        got = await asyncio.gather(*(client.get(k) for k in keys))
        client.close()
        return list(got), client.connects

    got, connects = asyncio.run(run())
    assert got[0] == big and got[1] == tricky
    assert got[2:-1] == [str(i).encode() for i in range(300)] and got[-1] is None
    assert connects == 1


def test_a_wrong_password_fails_the_command_and_counts_against_redis(server: Server) -> None:
    gate = RedisGate(0.5)

    async def run() -> None:
        client = fast_client(server.url(password="wrong"), gate)
        assert client is not None
        with pytest.raises(ResponseError):
            await client.get("k")

    asyncio.run(run())
    assert gate.failed_calls == 1 and gate.unreachable


def test_an_error_reply_fails_only_its_own_command(server: Server) -> None:
    redis.Redis.from_url(server.url()).rpush("a-list", "x")

    async def run() -> tuple[BaseException | bytes | None, bytes | None]:
        client = client_for(server.url(), timeout_s=1.0)
        client.set("fine", b"ok", 60_000)
        wrong, fine = await asyncio.gather(client.get("a-list"), client.get("fine"), return_exceptions=True)
        assert not isinstance(fine, BaseException)
        return wrong, fine

    wrong, fine = asyncio.run(run())
    assert isinstance(wrong, ResponseError) and "WRONGTYPE" in str(wrong)
    assert fine == b"ok"


def test_a_killed_server_fails_commands_at_once_and_the_client_reconnects(server: Server) -> None:
    gate = RedisGate(2.0)  # a bound far above "at once", so a loaded machine cannot blur the two

    async def run() -> tuple[float, float, bytes | None, int]:
        client = fast_client(server.url(), gate)
        assert client is not None
        client.set("k", b"before", 60_000)
        assert await client.get("k") == b"before"
        server.kill()
        # The connection's loss is seen at once, not after the bound.
        t0 = time.perf_counter()
        with pytest.raises(REDIS_FAULTS):
            await client.get("k")
        lost = time.perf_counter() - t0
        # A refused connect fails as fast.
        t0 = time.perf_counter()
        with pytest.raises(REDIS_FAULTS):
            await client.get("k")
        refused = time.perf_counter() - t0
        server.start()
        client.set("k", b"after", 60_000)
        got = await client.get("k")
        client.close()
        return lost, refused, got, client.connects

    lost, refused, got, connects = asyncio.run(run())
    assert lost < 0.5 and refused < 0.5, (lost, refused)
    assert got == b"after" and connects == 3
    assert gate.failed_calls == 2 and not gate.unreachable  # the answer after the restart


def test_a_frozen_server_costs_a_command_the_bound_and_nothing_is_left_waiting(server: Server) -> None:
    gate = RedisGate(0.05)
    assert server.proc is not None
    pid = server.proc.pid

    async def run() -> tuple[list[float], bytes | None]:
        client = fast_client(server.url(), gate)
        assert client is not None
        assert await client.get("k") is None  # connected
        os.kill(pid, signal.SIGSTOP)
        took = []
        try:
            client.set("k", b"stored while frozen", 60_000)
            for _ in range(3):  # on the open connection, then on new ones (accepted by the kernel)
                t0 = time.perf_counter()
                with pytest.raises(TimeoutError):
                    await client.get("k")
                took.append(time.perf_counter() - t0)
            # A store alone, nobody waiting on it, is failed by the same bound.
            client.set("k2", b"x", 60_000)
            await asyncio.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        got = await client.get("k")
        client.close()
        return took, got

    took, got = asyncio.run(run())
    # 50 ms and two turns of the loop; the margin is for a loaded machine.
    assert all(0.045 < t < 0.4 for t in took), took
    assert gate.failed_calls == 4
    # Whether the store made while frozen landed is Redis's business; the client answers again.
    assert got in (None, b"stored while frozen")


def test_sync_returns_once_every_store_is_answered(server: Server) -> None:
    async def run() -> None:
        client = client_for(server.url(), timeout_s=1.0)
        for i in range(50):
            client.set(f"s{i}", b"v", 60_000)
        await client.sync()
        # Answered, not only sent: another client sees every one.
        assert redis.Redis.from_url(server.url()).exists(*(f"s{i}" for i in range(50))) == 50
        client.close()

    asyncio.run(run())
