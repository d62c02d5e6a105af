"""ruff and mypy --strict stay clean for the packages (run as part of the suite, so CI enforces it)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

PACKAGES = ["gateway", "local_backend"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_is_clean() -> None:
    paths = [p for p in (*PACKAGES, "tests", "bench") if (ROOT / p).exists()]
    out = run("ruff", "check", *paths)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean() -> None:
    out = run("ruff", "format", "--check", *PACKAGES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_is_clean() -> None:
    out = run("mypy", "--strict", *PACKAGES)
    assert out.returncode == 0, out.stdout + out.stderr
