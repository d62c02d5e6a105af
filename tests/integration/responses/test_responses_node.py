"""The Responses API through the gateway with the official Node SDK (``npm install openai``
into a temporary folder), one call and one stream, translated and passed through."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import GatewayProcess, SimServer

SCRIPT = """
const OpenAI = require("openai");
const client = new OpenAI({ baseURL: process.argv[2], apiKey: "k1", maxRetries: 0 });
(async () => {
  const out = {};
  for (const model of ["sim-chat", "sim-native"]) {
    const r = await client.responses.create({ model, input: "Say hello.", instructions: "Be terse." });
    const kinds = [];
    let text = "";
    const stream = await client.responses.create({ model, input: "Tell me a story.", stream: true });
    for await (const event of stream) {
      kinds.push(event.type);
      if (event.type === "response.output_text.delta") text += event.delta;
    }
    out[model] = { id: r.id, output_text: r.output_text, kinds, text };
  }
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_sdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("npm/node are not installed: the Node SDK test needs them")
    folder = tmp_path_factory.mktemp("node")
    done = subprocess.run(
        ["npm", "install", "--silent", "--no-audit", "--no-fund", "openai"],
        cwd=folder,
        capture_output=True,
        timeout=240,
    )
    if done.returncode != 0:
        pytest.fail("npm install openai failed: " + done.stderr.decode()[-2000:])
    (folder / "check.js").write_text(SCRIPT)
    return folder


@pytest.fixture(scope="module")
def gateway(
    sim: SimServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    base = sim.base_url
    policy = f"""
deployments:
  sim-chat: {{provider: vllm, model: sim-fast, base_url: "{base}", response_model: deployment}}
  sim-native:
    {{provider: vllm, model: sim-fast, base_url: "{base}", responses_api: native, response_model: deployment}}
tiers:
  fast: [sim-chat]
"""
    gw = GatewayProcess(policy, redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw")).start()
    yield gw
    gw.stop()


def test_node_sdk_create_and_stream(node_sdk: Path, gateway: GatewayProcess) -> None:
    done = subprocess.run(
        ["node", "check.js", gateway.base_url], cwd=node_sdk, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    for model in ("sim-chat", "sim-native"):
        result = out[model]
        assert result["id"].startswith("resp")
        assert result["output_text"]
        assert result["kinds"][0] == "response.created"
        assert result["kinds"][-1] == "response.completed"
        assert result["text"]
