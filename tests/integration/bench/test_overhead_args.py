"""bench/overhead.sh refuses a ``--baseline`` that is not one of its own results before it
starts anything, instead of failing in the report after the runs and writing no results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def overhead(*args: str) -> subprocess.CompletedProcess[str]:
    # NGINX points nowhere: a run that gets past the baseline check stops at the next one.
    env = {**os.environ, "PYTHON": sys.executable, "NGINX": "/nonexistent/nginx"}
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "overhead.sh"), "--modes", "none", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=30,
    )


def test_a_file_that_is_not_a_result_is_refused_up_front() -> None:
    done = overhead("--baseline", "bench/baseline.json")  # the latency suite's, not this script's
    assert done.returncode == 2
    assert "--baseline bench/baseline.json: not a result of this script" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_result_file_passes_the_check(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"summary": [{"target": "gateway", "mode": "nonstream"}]}))
    done = overhead("--baseline", str(result))
    assert done.returncode == 2
    assert "nginx not found" in done.stderr
    assert "--baseline" not in done.stderr


def test_a_cache_mode_without_cache_is_refused() -> None:
    done = overhead("--modes", "cache-hit")
    assert done.returncode == 2
    assert "--modes cache-hit needs --cache" in done.stderr


def test_cache_is_accepted_with_its_modes() -> None:
    done = overhead("--cache")
    assert done.returncode == 2
    assert "nginx not found" in done.stderr
