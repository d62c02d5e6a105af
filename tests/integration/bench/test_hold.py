"""bench/hold.py (overhead.sh --hold) against the simulator over loopback HTTP: it holds the
streams open at once, reads each to ``data: [DONE]``, times the first byte, watches a process
group, and counts a failing answer as an error (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.helpers import ROOT, SimServer

HOLD = ROOT / "bench" / "hold.py"


def hold(*args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(HOLD), *args], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("HOLD_RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("HOLD_RESULT "))
    return done.returncode, result


def test_hold_keeps_every_stream_open_and_reads_it_to_the_end() -> None:
    # 20 ms to the first token, then 20 tokens 5 ms apart: each stream lasts ~120 ms, and
    # 30 of them opened over 0.3 s overlap.
    with SimServer("--model", "sim-fast:20:5", "--output-tokens", "20") as sim:
        assert sim.proc is not None
        url = sim.base_url + "/chat/completions"
        pgid = os.getpgid(sim.proc.pid)
        code, result = hold("--url", url, "--model", "sim-fast", "--streams", "30", "--ramp-s", "0.3",
                            "--pgid", str(pgid), "--label", "sim")  # fmt: skip
        assert code == 0, result
        assert result["label"] == "sim"
        assert result["complete"] == 30 and result["errors"] == 0
        assert result["open_peak"] >= 2
        assert 15 <= result["ttfb_ms"]["p50"] <= result["stream_ms"]["p50"]
        assert result["groups"][0]["pgid"] == pgid and result["groups"][0]["rss_peak_kb"] > 0

        code, result = hold("--url", sim.url + "/v1/no-such-path", "--model", "sim-fast",
                            "--streams", "3", "--ramp-s", "0")  # fmt: skip
        assert code == 1
        assert result["complete"] == 0 and result["errors"] == 3
        assert set(result["errors_detail"]) == {"status_404"}
