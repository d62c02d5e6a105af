"""bench/floor.py (overhead.sh --floor), both servers, between the official OpenAI SDK and the
simulator over loopback HTTP: the floor's row in the table means something only if the hop
forwards the upstream's answers unchanged, whole or as a stream."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.procutil import free_port, wait_http_ok
from tests.helpers import ROOT, SimServer, sim_policy

MESSAGES = [{"role": "user", "content": "Name three harbours."}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer() as server:
        yield server


@pytest.mark.parametrize("server", ["aiohttp", "protocol"])
def test_the_floor_forwards_answers_and_streams_unchanged(
    sim: SimServer, server: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(sim_policy(sim.base_url))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "floor.py"), "--policy", str(policy),
         "--port", str(port), "--server", server],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", 20, proc)
        direct = openai.OpenAI(base_url=sim.base_url, api_key="sk-test", max_retries=0)
        floor = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0)

        expected = direct.chat.completions.create(model="sim-fast", messages=MESSAGES)
        answer = floor.chat.completions.create(model="sim-fast", messages=MESSAGES)
        assert answer.choices[0].message.content == expected.choices[0].message.content
        assert answer.usage == expected.usage

        def streamed(client: openai.OpenAI) -> tuple[str, str | None]:
            chunks = list(client.chat.completions.create(model="sim-strong", messages=MESSAGES, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return text, next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)

        text, finish = streamed(floor)
        assert len(text) > 20 and finish == "stop"
        assert (text, finish) == streamed(direct)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"Traceback" not in err, err.decode()
