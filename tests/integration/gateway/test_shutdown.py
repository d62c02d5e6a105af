"""SIGTERM: stop accepting, let requests and streams in flight finish up to the deadline, then exit."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def slow() -> Iterator[SimServer]:
    # 40 ms between tokens, 60 tokens per answer: about 2.5 s each.
    with SimServer("--model", "slow:20:40", "--output-tokens", "60") as server:
        yield server


def _policy(sim: SimServer) -> str:
    return f'deployments:\n  slow: {{provider: vllm, base_url: "{sim.base_url}"}}\ntiers: {{fast: [slow]}}\n'


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_sigterm_drains_streams_and_requests_in_flight(slow: SimServer, make_gateway: Any) -> None:
    gw: GatewayProcess = make_gateway(_policy(slow), env={"SWITCHYARD_DRAIN_TIMEOUT_S": "20"})
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    results: dict[str, Any] = {}

    def unary() -> None:
        results["unary"] = client.chat.completions.create(model="fast", messages=MESSAGES)  # type: ignore[arg-type]

    stream = client.chat.completions.create(model="fast", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    chunks = iter(stream)
    first = next(chunks)
    worker = threading.Thread(target=unary)
    worker.start()
    time.sleep(0.3)  # the unary request is in flight upstream
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    while _accepts(gw.port):
        assert time.monotonic() - t0 < 2, "still accepting connections after SIGTERM"
        time.sleep(0.05)
    rest = list(chunks)
    worker.join(20)
    assert first.choices is not None
    assert rest[-1].choices[0].finish_reason in ("stop", "length")
    assert len(rest) >= 50
    assert results["unary"].choices[0].finish_reason in ("stop", "length")
    assert gw.proc.wait(20) == 0
    lines = gw.log_lines()
    assert any(line.get("event") == "draining" for line in lines)
    assert [line["status"] for line in lines if line.get("event") == "request"] == [200, 200]


def test_streams_past_the_drain_deadline_end_with_an_error_event(slow: SimServer, make_gateway: Any) -> None:
    gw: GatewayProcess = make_gateway(_policy(slow), env={"SWITCHYARD_DRAIN_TIMEOUT_S": "0.5"})
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model="fast", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    chunks = iter(stream)
    next(chunks)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        list(chunks)
    assert "shutting down" in str(info.value.message)
    assert gw.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5
