"""A simulator serving both dialects and one gateway with an Anthropic and an OpenAI-compatible
deployment, virtual keys on (so ``x-api-key`` is exercised by every anthropic SDK call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import GatewayProcess, SimServer
from tests.integration.gateway.test_keys import ADMIN_KEY, admin

PRICE = "{input: 3.0, cached_input: 0.3, output: 15.0}"


@pytest.fixture(scope="module")
def both_sim() -> Iterator[SimServer]:
    with SimServer("--model", "claude-sim:2:0.5", "--model", "sim-fast:2:0.5") as server:
        yield server


def policy(sim: SimServer, claude_extra: str = "") -> str:
    return f"""
deployments:
  claude: {{provider: anthropic, base_url: "{sim.base_url}", model: claude-sim, price: {PRICE}{claude_extra}}}
  local: {{provider: vllm, base_url: "{sim.base_url}", model: sim-fast, price: {PRICE}}}
tiers: {{strong: [claude], fast: [local]}}
"""


@pytest.fixture(scope="module")
def gateway(both_sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir: Path = tmp_path_factory.mktemp("anthropic-gw")
    gw = GatewayProcess(
        policy(both_sim),
        redis_url=redis_url,
        workdir=workdir,
        env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": ADMIN_KEY},
    )
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def key(gateway: GatewayProcess) -> str:
    _, made = admin(gateway, "POST", "/admin/keys", {"name": "anthropic-tests"})
    return str(made["key"])
