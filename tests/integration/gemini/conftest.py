"""The fake Gemini upstream and one gateway with Gemini API and Vertex AI deployments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import GatewayProcess
from tests.integration.gemini.fake_gemini import API_KEY, VERTEX_TOKEN, FakeGemini

PRICE = "{input: 1.0, cached_input: 0.25, output: 4.0}"


def policy(fake: FakeGemini) -> str:
    gemini = f'provider: gemini, base_url: "{fake.gemini_url}", api_key_env: GEMINI_TEST_KEY, price: {PRICE}'
    return f"""
deployments:
  flash: {{{gemini}, model: gemini-2.5-flash}}
  gemini3: {{{gemini}, model: gemini-3-pro-preview}}
  wrongkey: {{provider: gemini, base_url: "{fake.gemini_url}", api_key_env: GEMINI_WRONG_KEY, model: gemini-2.5-flash}}
  vertex: {{provider: vertex, base_url: "{fake.vertex_url()}", api_key_env: VERTEX_TEST_TOKEN, model: gemini-2.5-pro}}
  vertex-md: {{provider: vertex, base_url: "{fake.vertex_url()}", google_auth: metadata, model: gemini-2.5-pro}}
tiers: {{fast: [flash], strong: [gemini3]}}
dispatch:
  circuit: {{enabled: false}}
"""


@pytest.fixture(scope="package")
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


@pytest.fixture(scope="package")
def gateway(
    fake: FakeGemini, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("gemini-gw")
    env = {
        "GEMINI_TEST_KEY": API_KEY,
        "GEMINI_WRONG_KEY": "not-the-key",
        "VERTEX_TEST_TOKEN": VERTEX_TOKEN,
        "GCE_METADATA_HOST": f"127.0.0.1:{fake.port}",
    }
    gw = GatewayProcess(policy(fake), redis_url=redis_url, workdir=workdir, env=env)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(autouse=True)
def _clean(fake: FakeGemini) -> None:
    fake.reset()
