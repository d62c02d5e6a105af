"""Shared fixtures: a real Redis server, simulator processes and gateway processes on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store.embedded import EmbeddedRedis
from tests.helpers import OUTPUT_DIR, GatewayProcess, SimServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: ``SWITCHYARD_TEST_REDIS_URL`` when set (CI starts one), else a private
    redis-server child. Tests share it; each gateway fixture flushes it first."""
    url = os.environ.get("SWITCHYARD_TEST_REDIS_URL")
    if url:
        yield _worker_db(url)
        return
    with EmbeddedRedis() as server:
        yield server.url


def _worker_db(url: str) -> str:
    """Under pytest-xdist each worker flushes its own database of the shared server (gw0 -> 1,
    gw1 -> 2, ...), so one worker's flush never empties another's keys."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    return f"{base}/{1 + int(worker[2:]) % 15}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    """One simulator (models sim-fast and sim-strong, no added latency worth waiting for)."""
    with SimServer("--model", "sim-fast:5:1", "--model", "sim-strong:10:2") as server:
        yield server


@pytest.fixture()
def output_dir(request: pytest.FixtureRequest) -> Path:
    """A folder for a test's artefacts (screenshots, logs), kept after the run."""
    path = OUTPUT_DIR / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def make_gateway(redis_url: str, tmp_path: Path) -> Iterator[type[GatewayProcess]]:
    """Start gateways (``make_gateway(policy_yaml, ...)``); all are stopped after the test."""
    started: list[GatewayProcess] = []

    def factory(policy: str, **kwargs: object) -> GatewayProcess:
        gw = GatewayProcess(policy, redis_url=redis_url, workdir=tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(gw)
        return gw.start()

    yield factory  # type: ignore[misc]
    for gw in started:
        gw.stop()
