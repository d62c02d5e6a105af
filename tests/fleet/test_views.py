"""Every view is the fleet's: ``/admin/stats``, the dashboard's data, ``switchyard stats`` and
``/admin/costs`` read the same from every gateway and equal what the load generator saw;
``/admin/fleet`` lists the three live gateways, one policy."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest

from gateway.cachestats.cost import NANO_USD, cost_nano_usd
from gateway.config import parse_policy
from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import ADMIN_KEY, FleetBed, admin
from gateway.tools.fleet.load import chat_body, run_load
from tests.helpers import ROOT

pytestmark = pytest.mark.fleet

PREFIXES = [f"You are fleet assistant {i}. " + "Answer in the house style, briefly. " * 40 for i in range(4)]


def settled(bed: FleetBed, path: str, want: Any) -> list[Any]:
    """``path`` from every gateway, once the first equals ``want(body)`` (stats are written
    in batches) and all agree."""
    deadline = time.monotonic() + 15
    while True:
        bodies = [admin(g.url, path) for g in bed.gateways]
        if want(bodies[0]) and all(strip(b) == strip(bodies[0]) for b in bodies):
            return bodies
        assert time.monotonic() < deadline, orjson.dumps(bodies, option=orjson.OPT_INDENT_2).decode()[:4000]
        time.sleep(0.2)


def strip(body: Any) -> Any:
    """A report without what is this process's own (live circuits, drift, write counters)."""
    if isinstance(body, dict):
        return {
            k: strip(v)
            for k, v in body.items()
            if k not in ("live", "routing", "fleet", "stats_writes", "generated_at")
        }
    return body


def test_every_gateway_reports_the_fleets_figures(bed: FleetBed) -> None:
    key = bed.create_key("views")
    gateways = [g.url for g in bed.gateways]
    result = asyncio.run(
        run_load(
            lambda: gateways,
            key,
            lambda i: chat_body(PREFIXES[i % 4], f"question {i}"),
            rate_per_s=20,
            duration_s=3,
            tag="views",
        )
    )
    assert not result.failed and result.admitted == 60
    prompt, cached, completion = result.tokens()
    assert cached > 0
    price = parse_policy(bed.policy_path.read_text(), "p").deployments["local"].price
    cost_nano = sum(cost_nano_usd(price, o.usage) for o in result.outcomes)

    stats = settled(
        bed, "/admin/stats?since=5m", lambda b: b["deployments"].get("local", {}).get("requests") == 60
    )
    local = stats[0]["deployments"]["local"]
    assert (local["prompt_tokens"], local["cached_tokens"]) == (prompt, cached)

    costs = settled(bed, "/admin/costs?days=1", lambda b: b["days"][0]["requests"] == 60)
    day = costs[0]["days"][0]
    assert day["deployments"]["local"]["requests"] == 60
    assert (day["prompt_tokens"], day["cached_tokens"], day["completion_tokens"]) == (
        prompt,
        cached,
        completion,
    )
    assert day["cost_usd"] == round(cost_nano / NANO_USD, 9)

    dash = settled(bed, "/admin/dashboard?since=5m", lambda b: True)
    assert strip(dash[0]) == strip(dash[2])

    # The command reads what /admin/stats says (one gateway is enough: they all agree above).
    for g in bed.gateways[2:]:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "stats", "--json", "--since", "5m", "--url", g.url],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
            env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert strip(orjson.loads(done.stdout)) == strip(stats[0])


def test_admin_fleet_lists_every_live_gateway(bed: FleetBed) -> None:
    figures = checks.fleet_view(bed)
    assert figures["ok"], figures
    views = [admin(g.url, "/admin/fleet") for g in bed.gateways]
    for view in views:
        assert view["live"] == 3
        assert sorted(b["address"] for b in view["gateways"]) == sorted(
            f"{g.host.address}:{g.port}" for g in bed.gateways
        )
        assert len(view["policies"]) == 1
    assert len({v["self"] for v in views}) == 3
