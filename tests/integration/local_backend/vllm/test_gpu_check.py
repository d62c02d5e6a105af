"""local_backend/vllm/gpu_check.sh end to end without a GPU: fake nvidia-smi and fake vllm (the
executable serves the simulator; an importable stub satisfies the script's `import vllm`)."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.procutil import free_port
from tests.fixtures.fake_vllm_harness import FakeVllm
from tests.helpers import ROOT

SCRIPT = ROOT / "local_backend" / "vllm" / "gpu_check.sh"


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("bash") is None, reason="needs bash and curl"
)
@pytest.mark.slow
def test_gpu_check_serves_replays_with_shaping_off_and_on_and_prints_vllms_figures(tmp_path: Path) -> None:
    fake = FakeVllm(tmp_path)
    fake.control({"ttft_ms": 5, "itl_ms": 1})
    executable(fake.bin_dir / "nvidia-smi", '#!/bin/sh\necho "Fake GPU, 81559 MiB"\n')
    stub = tmp_path / "stub"
    (stub / "vllm").mkdir(parents=True)
    (stub / "vllm" / "__init__.py").write_text('__version__ = "0.0-fake"\n')
    env = {
        **fake.env,
        "PYTHONPATH": str(stub),
        "PYTHON": sys.executable,
        "VLLM_PORT": str(free_port()),
        "GATEWAY_PORT": str(free_port()),
        "REQUESTS": "24",
        "CONCURRENCY": "4",
        "STARTUP_TIMEOUT_S": "60",
    }
    out = subprocess.run(
        ["bash", str(SCRIPT), "org/tiny"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vLLM 0.0-fake, model org/tiny" in out.stdout
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.startswith("shaping-")}
    assert set(rows) == {"shaping-off", "shaping-on"}
    off_rate, on_rate = float(rows["shaping-off"][3]), float(rows["shaping-on"][3])
    assert rows["shaping-off"][1] == rows["shaping-on"][1] == "24" and rows["shaping-on"][2] == "0"
    assert on_rate > 80.0 and off_rate < 10.0  # the volatile date first defeats the prefix cache
    launch = fake.launches()[0]["argv"]
    assert launch[:2] == ["serve", "org/tiny"] and "--enable-prompt-tokens-details" in launch
