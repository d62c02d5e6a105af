"""``GET /admin/dashboard``'s ``series`` through a running gateway, a real Redis and the
simulator: the points add up to the traffic sent; and ``GET /`` leads to the dashboard."""

from __future__ import annotations

import http.client
import time
from typing import Any

import pytest

from tests.helpers import SimServer
from tests.integration.telemetry.test_dashboard_api import dashboard, priced_policy, send_traffic


def test_series_points_add_up_to_the_traffic_sent(make_gateway: Any, sim: SimServer) -> None:
    sim.reset()
    gw = make_gateway(priced_policy(sim))
    send_traffic(gw, sim)
    time.sleep(0.5)  # stats reach Redis within ~100 ms
    d = dashboard(gw, "1h")
    s = d["series"]
    assert s["step_s"] == 60 and len(s["t"]) == 60
    assert all(b - a == 60 for a, b in zip(s["t"], s["t"][1:], strict=False))
    assert sum(s["requests"]) == d["totals"]["requests"] == 9
    assert sum(s["errors"]) == 0
    assert {tier: sum(v) for tier, v in s["tiers"].items()} == {"fast": 5, "strong": 4}
    assert sum(s["cost_usd"]) == pytest.approx(d["totals"]["cost_usd"])
    assert {name: sum(dep["requests"]) for name, dep in s["deployments"].items()} == {
        "sim-fast": 5,
        "sim-strong": 4,
    }
    fast_e2e = [v for v in s["deployments"]["sim-fast"]["e2e_ms"]["p95"] if v is not None]
    assert fast_e2e and 0 < max(fast_e2e) < 2000
    strong_ttft = [v for v in s["deployments"]["sim-strong"]["ttft_ms"]["p50"] if v is not None]
    assert len(strong_ttft) == 1  # one stream
    assert sum(s["cache"]["prompt_tokens"]) == d["cache"]["totals"]["prompt_tokens"] > 0
    assert any(rate is not None for rate in s["cache"]["hit_rate"])
    assert any(rate is not None for rate in s["cache"]["expected_hit_rate"])
    # A window over two hours folds minutes into wider points, never more than 120 of them.
    day = dashboard(gw, "24h")["series"]
    assert day["step_s"] == 720 and len(day["t"]) == 120 and sum(day["requests"]) == 9


def test_root_redirects_to_the_dashboard(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(priced_policy(sim))
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=5)
    conn.request("GET", "/")
    resp = conn.getresponse()
    assert resp.status == 302 and resp.getheader("Location") == "/dashboard"
    conn.close()
