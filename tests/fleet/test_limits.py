"""Limits and budgets hold fleet-wide: keys hit through all three gateways at three times
their limit are admitted as one token bucket in Redis allows (within 2 % of the limit),
and a budget is overspent by no more than the requests in flight when it ran out."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.cachestats.cost import cost_nano_usd
from gateway.config import parse_policy
from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import FleetBed, admin
from gateway.tools.fleet.load import chat_body, run_load

pytestmark = pytest.mark.fleet

SYSTEM = checks.RPM_SYSTEM


def test_rpm_and_tpm_hold_across_three_gateways_at_three_times_the_limit(bed: FleetBed) -> None:
    figures = checks.limits(bed, rpm=60, steady_s=20.0)
    print(f"limits: {figures}")
    assert figures["failed"] == 0
    assert figures["rpm_burst_admitted"] == 60
    # One bucket for the fleet: what it refills from the burst on, not three times that.
    # Within 2 % of the limit (60 a minute: 1.2 requests; TPM: plus the last request, which
    # is charged when it ends).
    expected = figures["rpm_expected"]
    assert abs(figures["rpm_admitted"] - expected) <= 0.02 * 60, figures
    expected_tokens = figures["tpm_expected_tokens"]
    slack = 0.02 * figures["tpm"] + figures["tpm_request_tokens"]
    assert abs(figures["tpm_admitted_tokens"] - expected_tokens) <= slack, figures
    assert figures["ok"]


def test_a_budget_is_overspent_by_at_most_the_requests_in_flight(bed: FleetBed) -> None:
    gateways = [g.url for g in bed.gateways]
    price = parse_policy(bed.policy_path.read_text(), "p").deployments["local"].price
    budget = 0.0005
    key = bed.create_key("budget", budget_usd=budget)
    result = asyncio.run(
        run_load(
            lambda: gateways,
            key,
            lambda i: chat_body(SYSTEM, f"b {i}"),
            rate_per_s=20,
            duration_s=2.5,
            tag="budget",
        )
    )
    assert not result.failed
    answered = [o for o in result.outcomes if o.ok]
    costs = [cost_nano_usd(price, o.usage) / 1e9 for o in answered]
    spent_seen = sum(costs)
    deadline = time.monotonic() + 10
    while True:
        record = next(k for k in admin(bed.gateways[0].url, "/admin/keys")["data"] if k["name"] == "budget")
        if abs(record["spend_usd"] - spent_seen) < 1e-9 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert abs(record["spend_usd"] - spent_seen) < 1e-9
    # In flight at once: the most requests the client had outstanding together.
    events = sorted([(o.started, 1) for o in answered] + [(o.ended, -1) for o in answered])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    overspend = spent_seen - budget
    print(f"budget ${budget}: spent ${spent_seen:.6f} over {len(answered)} requests, overspend ${overspend:.6f}, "
          f"largest request ${max(costs):.6f}, peak in flight {peak}")  # fmt: skip
    assert result.limited > 0 and spent_seen >= budget
    assert overspend <= max(costs) * peak
