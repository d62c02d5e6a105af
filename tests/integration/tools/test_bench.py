"""``switchyard bench run`` through a real gateway and simulator, and ``bench compare``: a
deliberately slowed simulator fails the comparison, the same one passes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.tools.bench import load_workload
from tests.helpers import ROOT, SimServer, sim_policy

WORKLOAD = """
name: test-mix
model: fast
concurrency: 3
duration_s: 2s
warmup_s: 0.3s
stream_share: 0.6
seed: 7
shapes:
  - {name: short, weight: 3, prompt_tokens: 100, max_tokens: 12}
  - {name: long, weight: 1, prompt_tokens: 3000, shared_prefix_tokens: 2000, max_tokens: 12, model: strong}
"""


def switchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def bench_run(make_gateway: Any, sim: SimServer, workload: Path, out: Path) -> dict[str, Any]:
    gw = make_gateway(sim_policy(sim.base_url))
    done = switchyard("bench", "run", str(workload), "--out", str(out), "--base-url", gw.base_url)
    assert done.returncode == 0, done.stderr + done.stdout
    gw.stop()
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_a_slowed_simulator_fails_compare_and_the_same_one_passes(make_gateway: Any, tmp_path: Path) -> None:
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    base_path, same_path, slow_path = tmp_path / "base.json", tmp_path / "same.json", tmp_path / "slow.json"
    with SimServer("--model", "sim-fast:20:3", "--model", "sim-strong:40:4") as sim:
        base = bench_run(make_gateway, sim, workload, base_path)
        bench_run(make_gateway, sim, workload, same_path)
    with SimServer("--model", "sim-fast:60:9", "--model", "sim-strong:120:12") as slow_sim:
        bench_run(make_gateway, slow_sim, workload, slow_path)

    assert base["errors"] == 0 and base["requests"] > 10
    for name in ("short", "long"):
        stats = base["shapes"][name]
        assert stats["requests"] > 0
        assert stats["e2e_ms"]["p50"] <= stats["e2e_ms"]["p95"] <= stats["e2e_ms"]["p99"]
    short = base["shapes"]["short"]
    if short["ttft_ms"]["count"]:
        # The simulator's 20 ms TTFT, measured at the client.
        assert 20 <= short["ttft_ms"]["p50"] < 200
        assert short["itl_ms"]["p50"] >= 2.5

    slowed = switchyard("bench", "compare", str(base_path), str(slow_path), "--max-regression", "10%")
    assert slowed.returncode == 1, slowed.stdout
    assert "REGRESSED (> 10%)" in slowed.stdout and "ttft_ms" in slowed.stdout
    assert "regressed by more than 10%" in slowed.stdout
    # A rerun on the same simulator is within a generous bound (CI machines are noisy).
    same = switchyard("bench", "compare", str(base_path), str(same_path), "--max-regression", "100%")
    assert same.returncode == 0, same.stdout
    assert "REGRESSED" not in same.stdout


def test_compare_rejects_what_is_not_a_result_and_bad_bounds(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}')
    done = switchyard("bench", "compare", str(bogus), str(bogus))
    assert done.returncode == 2 and "not a 'switchyard bench run' result" in done.stderr
    baseline = str(ROOT / "bench" / "baseline.json")
    done = switchyard("bench", "compare", baseline, baseline, "--max-regression", "ten")
    assert done.returncode == 2 and "not a ratio" in done.stderr


def test_the_shipped_workload_and_baseline_agree(tmp_path: Path) -> None:
    workload = load_workload(str(ROOT / "bench" / "workload.yaml"))
    baseline = json.loads((ROOT / "bench" / "baseline.json").read_text())
    assert baseline["workload"] == workload.name
    assert set(baseline["shapes"]) == {s.name for s in workload.shapes}
    assert baseline["errors"] == 0
    done = switchyard(
        "bench", "compare", str(ROOT / "bench" / "baseline.json"), str(ROOT / "bench" / "baseline.json")
    )
    assert done.returncode == 0 and "no p95 regressed" in done.stdout


def test_a_bad_workload_is_reported_with_its_location(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("shapes:\n  - {name: x, weight: -1}\nconcurrency: 0\n")
    done = switchyard("bench", "run", str(bad), "--out", str(tmp_path / "o.json"))
    assert done.returncode == 2
    assert "shapes[0].weight" in done.stderr and "concurrency" in done.stderr
