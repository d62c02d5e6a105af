"""``python -m local_backend.sim``: flags, the start-up line, faults from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from local_backend.sim import SimControl

ROOT = Path(__file__).resolve().parents[3]


@contextmanager
def sim_process(*args: str) -> Iterator[str]:
    """Start the simulator on a free port; yield its URL from the start-up line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_backend.sim", "--port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("switchyard-sim listening on http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        yield line.split()[-1]
    finally:
        proc.terminate()
        assert proc.wait(10) == 0  # SIGTERM is a clean stop


def test_start_up_line_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text(
        "models:\n  from-yaml: {ttft_ms: 1, itl_ms: 0, output_tokens: [3, 3]}\nchunk_tokens: 2\n"
    )
    with sim_process(
        "--config", str(config), "--fault", "from-yaml:length=1#1", "--cache-model", "none"
    ) as url:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["from-yaml"]
        first = client.chat.completions.create(
            model="from-yaml", messages=[{"role": "user", "content": "x" * 200}]
        )
        second = client.chat.completions.create(
            model="from-yaml", messages=[{"role": "user", "content": "x" * 200}]
        )
        assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 1  # type: ignore[union-attr]
        assert second.usage.completion_tokens == 3 and second.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
        assert SimControl(url).stats()["faults"] == {"length": 1}


def test_models_flag_replaces_the_defaults_and_api_key() -> None:
    with sim_process("--model", "a:1:0", "--model", "b", "--require-api-key", "k") as url:
        request = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["a", "b"]


@pytest.mark.parametrize("args", [["--fault", "nonsense"], ["--max-num-seqs", "0"]])
def test_bad_flags_exit_non_zero(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "local_backend.sim", "--port", "0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2 and "switchyard sim:" in done.stderr
