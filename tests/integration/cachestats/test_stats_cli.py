"""``switchyard stats --since``: every window form the help text and the docs name is
accepted by a real gateway, and the report covers the window asked for (capped at 48 h)."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import orjson
import pytest

from tests.helpers import ROOT, GatewayProcess, SimServer, sim_policy


def run_stats(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {"SWITCHYARD_URL": gw.url, "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "gateway", "stats", *args]
    return subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT, timeout=30)


def documented_forms() -> list[str]:
    """The examples ``switchyard stats --help`` gives for ``--since``."""
    help_text = subprocess.run(
        [sys.executable, "-m", "gateway", "stats", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    flat = " ".join(help_text.split())
    match = re.search(r"window: ([^()]+?) \(default", flat)
    assert match, help_text
    return [form.strip() for form in match.group(1).split(",")]


def test_the_help_names_the_day_form() -> None:
    assert documented_forms() == ["90s", "15m", "1h", "2d"]


# (form, the window the report covers): a window past 48 h is capped, one under a minute raised.
WINDOWS = [
    ("90s", 90),
    ("15m", 900),
    ("1h", 3600),
    ("2d", 172800),
    ("48h", 172800),
    ("3d", 172800),
    ("30s", 60),
]


@pytest.mark.slow
def test_every_documented_window_is_accepted(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    assert {form for form, _ in WINDOWS} >= set(documented_forms())
    for since, window_s in WINDOWS:
        done = run_stats(gw, "--since", since, "--json")
        assert done.returncode == 0, (since, done.stderr)
        assert orjson.loads(done.stdout)["since_s"] == window_s, since
        table = run_stats(gw, "--since", since)
        assert table.returncode == 0 and f"over the last {window_s // 60} min".encode() in table.stdout, since


def test_a_window_that_is_not_a_duration_is_the_servers_400(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    done = run_stats(gw, "--since", "2 weeks")
    assert done.returncode == 1
    assert b"answered 400: since: not a duration" in done.stderr
    assert b"ms, s, m, h or d" in done.stderr
