"""Two gateways sharing one Redis, each answering from its local view of the response cache
(hits without a GET), and ``switchyard cache purge`` on the side: once it returns, neither
gateway serves a purged entry (beyond the invalidation's delivery, a few milliseconds)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
import redis

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import GatewayProcess, SimServer, sim_policy

ROOT = Path(__file__).resolve().parents[3]
MESSAGES = [{"role": "user", "content": "a question both gateways are asked"}]


@pytest.fixture()
def own_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(supervise=False) as server:
        yield server


@pytest.fixture()
def fleet(sim: SimServer, own_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    gateways = [
        GatewayProcess(
            sim_policy(sim.base_url, "cache: {enabled: true}\n"),
            redis_url=own_redis.url,
            workdir=tmp_path,
            env={"SWITCHYARD_AUTH": "none"},
            flush_redis=first,
        )
        for first in (True, False)
    ]
    for gw in gateways:
        gw.start()
    yield gateways
    for gw in gateways:
        gw.stop()
        assert "Traceback" not in gw.log_path.read_text()


def ask(gw: GatewayProcess, store: bool = True) -> str:
    client = openai.OpenAI(base_url=gw.base_url, api_key="none", max_retries=0, timeout=10)
    headers = {} if store else {"Cache-Control": "no-store"}
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        extra_headers=headers,
    )
    assert raw.parse().choices[0].message.content
    return raw.headers.get("x-switchyard-cache", "")


@contextmanager
def watching(url: str) -> Iterator[list[str]]:
    """The commands Redis runs meanwhile (``MONITOR``)."""
    commands: list[str] = []
    ready = threading.Event()
    stop = f"ECHO watch-stop-{time.monotonic_ns()}"

    def watch() -> None:
        with redis.Redis.from_url(url).monitor() as monitor:
            ready.set()
            while (command := monitor.next_command()["command"]) != stop:
                commands.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield commands
    redis.Redis.from_url(url).echo(stop.partition(" ")[2])
    thread.join(10)


def until(gw: GatewayProcess, want: set[str], seconds: float = 10.0, store: bool = True) -> str:
    deadline = time.monotonic() + seconds
    while (outcome := ask(gw, store)) not in want:
        assert time.monotonic() < deadline, f"{gw.base_url} answered {outcome!r}, not {want}"
        time.sleep(0.02)
    return outcome


def test_a_purge_on_the_side_stops_every_gateway_serving_its_entries(
    fleet: list[GatewayProcess], own_redis: EmbeddedRedis
) -> None:
    a, b = fleet
    assert ask(a) == "store"  # the first lookup starts a gateway's tracking
    assert ask(b) == "hit"
    for gw in fleet:
        deadline = time.monotonic() + 10
        while "cache_view_ready" not in gw.log_path.read_text():
            assert time.monotonic() < deadline, "tracking never came up"
            time.sleep(0.02)
    assert ask(a) == ask(b) == "hit"  # read once more, now kept in each view
    with watching(own_redis.url) as commands:
        outcomes = [ask(gw) for gw in (a, b) for _ in range(10)]
    assert outcomes == ["hit"] * 20
    # Every hit answered from the gateways' own views (a GET each without them).
    assert not [c for c in commands if c.startswith("GET sy:rc:")], commands
    subprocess.run(
        [sys.executable, "-m", "gateway", "cache", "purge", "--all", "--redis-url", own_redis.url],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=30,
    )
    # Neither gateway serves the purged entry once the invalidation has arrived (asked
    # with no-store: a miss must not store the entry again).
    until(a, {"miss"}, seconds=1.0, store=False)
    until(b, {"miss"}, seconds=1.0, store=False)
    assert ask(a, store=False) == ask(b, store=False) == "miss"
