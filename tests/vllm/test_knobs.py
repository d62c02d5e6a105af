"""Knobs this vLLM may or may not have: accepted, or refused by name before anything starts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import LaunchError
from local_backend.vllm import Supervisor
from tests.vllm.conftest import RealVllm, run_cli

# vLLM starts in tens of seconds, minutes on a busy 2-core machine.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def launch(real: RealVllm, **knobs: object) -> VllmLaunch:
    base: dict[str, object] = {
        "executable": real.executable,
        "model": str(real.model),
        "max_model_len": 2048,
        "enforce_eager": True,
        "cpu_kv_cache_gib": 1,
    }
    return VllmLaunch.model_validate({**base, **knobs})


def check(real: RealVllm, launch: VllmLaunch) -> str | None:
    """None when the installed vLLM accepts the launch, else the refusal."""

    async def main() -> str | None:
        supervisor = Supervisor({"tiny": launch}, {**os.environ, **real.env})
        try:
            await supervisor.check()
        except LaunchError as exc:
            return str(exc)
        return None

    return asyncio.run(main())


def test_a_flag_the_installed_vllm_no_longer_has_is_refused_before_launch(
    real_vllm: RealVllm, tmp_path: Path
) -> None:
    config = tmp_path / "launch.yaml"
    config.write_text(real_vllm.launch_yaml(kv_cache_dtype="fp8", calculate_kv_scales=True, port=18999))
    out = run_cli("local", "serve", str(config), env=real_vllm.env, timeout_s=180)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr
    line = out.stderr.strip().splitlines()[-1]
    # vLLM 0.32 removed --calculate-kv-scales; older versions accept it.
    assert "does not accept knob calculate_kv_scales (--calculate-kv-scales)" in line, line
    assert "vllm_starting" not in out.stdout  # nothing was started


def test_ngram_speculative_decoding_and_an_fp8_kv_cache_are_accepted_or_refused_clearly(
    real_vllm: RealVllm,
) -> None:
    ngram = check(
        real_vllm,
        launch(
            real_vllm, speculative={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
        ),
    )
    assert ngram is None, ngram  # vLLM's CPU build runs ngram drafting (serves with it: see docs)
    fp8 = check(real_vllm, launch(real_vllm, kv_cache_dtype="fp8"))
    # Accepted where the CPU has AVX-512 or AMX; elsewhere vLLM's own reason, before launch.
    assert fp8 is None or ("refuses the configuration" in fp8 and "FP8" in fp8), fp8
