"""Images and files in a Responses request reach the upstream they are translated for, with
the official openai SDK through the gateway: a chat upstream (the simulator's vLLM-like API)
and an Anthropic one (its Messages API). Both simulators seed an answer from the whole prompt
they received, so the same request answers the same text and a request that differs only in
its image (or file) answers another: an upstream that was sent a constant or nothing in
place of the image cannot tell them apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer

PNG_A = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PNG_B = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
PDF_A = "data:application/pdf;base64,JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PC9UeXBlL0NhdGFsb2c+PgplbmRvYmoK"
PDF_B = "data:application/pdf;base64,JVBERi0xLjcKJeLjz9MKMSAwIG9iago8PC9UeXBlL1BhZ2VzPj4KZW5kb2JqCg=="


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with SimServer("--model", "claude-sim:2:0.5", "--model", "sim-fast:2:0.5") as sim:
        policy = f"""
deployments:
  chat: {{provider: vllm, base_url: "{sim.base_url}", model: sim-fast}}
  claude: {{provider: anthropic, base_url: "{sim.base_url}", model: claude-sim}}
tiers: {{fast: [chat], strong: [claude]}}
"""
        gw = GatewayProcess(policy, redis_url=redis_url, workdir=tmp_path_factory.mktemp("gw")).start()
        yield gw
        gw.stop()


@pytest.fixture()
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0, timeout=15) as c:
        yield c


def _answer(client: openai.OpenAI, model: str, part: dict[str, Any]) -> str:
    content: Any = [{"type": "input_text", "text": "Describe this."}, part]
    response = client.responses.create(
        model=model, input=[{"role": "user", "content": content}], max_output_tokens=40, store=False
    )
    assert response.output_text
    return response.output_text


@pytest.mark.parametrize("model", ["chat", "claude"])
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("https://example.com/harbor.jpg", "https://example.com/lighthouse.jpg"),
        (PNG_A, PNG_B),
    ],
    ids=["url", "base64"],
)
def test_the_upstream_sees_which_image_was_sent(client: openai.OpenAI, model: str, a: str, b: str) -> None:
    first = _answer(client, model, {"type": "input_image", "image_url": a, "detail": "auto"})
    assert _answer(client, model, {"type": "input_image", "image_url": a, "detail": "auto"}) == first
    assert _answer(client, model, {"type": "input_image", "image_url": b, "detail": "auto"}) != first


def test_the_chat_upstream_sees_which_file_was_sent(client: openai.OpenAI) -> None:
    def part(data: str, name: str) -> dict[str, Any]:
        return {"type": "input_file", "file_data": data, "filename": name}

    first = _answer(client, "chat", part(PDF_A, "rules.pdf"))
    assert _answer(client, "chat", part(PDF_A, "rules.pdf")) == first
    assert _answer(client, "chat", part(PDF_B, "rules.pdf")) != first
    assert _answer(client, "chat", part(PDF_A, "tides.pdf")) != first


@pytest.mark.parametrize("kind", ["input_image", "input_file"])
def test_a_part_by_file_id_is_a_400_naming_it(client: openai.OpenAI, kind: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _answer(client, "chat", {"type": kind, "file_id": "file-abc123"})
    assert info.value.param == "input[0].content[1]"  # type: ignore[attr-defined]
    assert "file_id" in info.value.message
