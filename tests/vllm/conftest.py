"""The real vLLM the ``vllm`` tests run against: the venv and tiny model made by
``tests/vllm/setup_vllm.sh`` (``SWITCHYARD_VLLM_VENV``, ``SWITCHYARD_VLLM_MODEL``).

These tests are deselected by default (``-m 'not vllm'`` in pyproject); when asked for and
the set-up is missing, they fail, never skip: a CI job that cannot install vLLM must say so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, GatewayProcess


@dataclass(frozen=True)
class RealVllm:
    """Where the real vLLM and the tiny model are, and the environment to run them with."""

    venv: Path
    model: Path

    @property
    def executable(self) -> str:
        return str(self.venv / "bin" / "vllm")

    @property
    def env(self) -> dict[str, str]:
        # No model hub: everything is local. Threads: this job shares a small machine.
        return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}

    def launch_yaml(self, indent: str = "", **knobs: Any) -> str:
        """A launch block (YAML lines at ``indent``) for the tiny model, small and quick to start."""
        base: dict[str, Any] = {
            "executable": self.executable,
            "model": str(self.model),
            "max_model_len": 2048,
            "enforce_eager": True,
            "cpu_kv_cache_gib": 1,
            "health_interval_s": 0.5,
            "startup_timeout_s": 400,
            "restart_backoff_s": 0.5,
            "drain_timeout_s": 30,
        }
        base.update(knobs)
        return "".join(f"{indent}{k}: {_yaml(v)}\n" for k, v in base.items())


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return str(value)


@pytest.fixture(scope="session")
def real_vllm() -> RealVllm:
    venv = os.environ.get("SWITCHYARD_VLLM_VENV")
    model = os.environ.get("SWITCHYARD_VLLM_MODEL")
    if not venv or not model:
        pytest.fail(
            'the vllm tests need a real vLLM: run `eval "$(tests/vllm/setup_vllm.sh)"` first '
            "(it sets SWITCHYARD_VLLM_VENV and SWITCHYARD_VLLM_MODEL)",
            pytrace=False,
        )
    real = RealVllm(Path(venv), Path(model))
    if not Path(real.executable).exists() or not (real.model / "config.json").exists():
        pytest.fail(
            f"no vllm in {venv} or no model in {model}: rerun tests/vllm/setup_vllm.sh", pytrace=False
        )
    return real


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def module_redis() -> Iterator[str]:
    url = os.environ.get("SWITCHYARD_TEST_REDIS_URL")
    if url:
        yield url
        return
    from gateway.store.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url


def start_gateway(policy: str, redis_url: str, workdir: Path, real: RealVllm) -> GatewayProcess:
    """A gateway (its own process) that may launch vLLM itself."""
    return GatewayProcess(policy, redis_url=redis_url, workdir=workdir, env=real.env).start()


def run_cli(*args: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``switchyard ARGS`` in a child process."""
    import sys

    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=timeout_s, check=False,
    )  # fmt: skip
