"""Limits and budgets hold fleet-wide: keys hit through all three gateways at three times
their limit are admitted as one token bucket in Redis allows (within 2 %), and a budget is
overspent by no more than the requests in flight when it ran out."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.cachestats.cost import cost_nano_usd
from gateway.config import parse_policy
from gateway.tools.fleet.bed import FleetBed, admin
from gateway.tools.fleet.load import LoadResult, chat_body, run_load

pytestmark = pytest.mark.fleet

RPM = 60
STEADY_S = 20.0
SYSTEM = "You are terse."


def within(actual: float, expected: float, share: float = 0.02, slack: float = 0.0) -> bool:
    return abs(actual - expected) <= max(share * expected, 1.0) + slack


def test_rpm_and_tpm_hold_across_three_gateways_at_three_times_the_limit(bed: FleetBed) -> None:
    gateways = [g.url for g in bed.gateways]
    # One request's tokens, to size the TPM key so its limit is one request a second too.
    probe_key = bed.create_key("probe")
    probe = asyncio.run(
        run_load(lambda: gateways, probe_key, lambda i: chat_body(SYSTEM, "q 0"), rate_per_s=1, duration_s=1)
    )
    per_request = probe.outcomes[0].prompt_tokens + probe.outcomes[0].completion_tokens
    tpm = 60 * per_request
    rpm_key = bed.create_key("rpm", rpm=RPM)
    tpm_key = bed.create_key("tpm", tpm=tpm)
    body = lambda i: chat_body(SYSTEM, f"q {i % 10}")  # noqa: E731 - same size every time

    async def main() -> tuple[LoadResult, LoadResult, LoadResult, LoadResult]:
        # Empty both buckets first: RPM with a burst of a minute's requests, TPM with one
        # request about as large as its minute (the simulator counts ~4 characters a token).
        burst = await run_load(
            lambda: gateways, rpm_key, body, rate_per_s=400, duration_s=RPM / 400, tag="burst"
        )
        big = chat_body("x " * (2 * tpm), "q")
        drain = await run_load(
            lambda: gateways, tpm_key, lambda i: big, rate_per_s=1, duration_s=1, tag="drain"
        )
        steady_rpm, steady_tpm = await asyncio.gather(
            run_load(
                lambda: gateways, rpm_key, body, rate_per_s=3 * RPM / 60, duration_s=STEADY_S, tag="rpm"
            ),
            run_load(
                lambda: gateways,
                tpm_key,
                body,
                rate_per_s=3 * tpm / 60 / per_request,
                duration_s=STEADY_S,
                tag="tpm",
            ),
        )
        return burst, drain, steady_rpm, steady_tpm

    burst, drain, steady_rpm, steady_tpm = asyncio.run(main())
    for result in (burst, drain, steady_rpm, steady_tpm):
        assert not result.failed, [(o.status, o.error) for o in result.failed[:5]]
    assert burst.admitted == RPM
    window_s = steady_rpm.outcomes[-1].started - burst.outcomes[0].started
    # The bucket refills RPM/60 a second from the burst on: that many, not three times that.
    expected = RPM * window_s / 60
    print(f"rpm {RPM}: {len(steady_rpm.outcomes)} sent in {window_s:.1f} s at 3x over 3 gateways, "
          f"{steady_rpm.admitted} admitted, expected {expected:.1f}")  # fmt: skip
    assert within(steady_rpm.admitted, expected), (steady_rpm.admitted, expected)
    tokens = sum(o.prompt_tokens + o.completion_tokens for o in steady_tpm.outcomes if o.ok)
    drained = drain.outcomes[0].prompt_tokens + drain.outcomes[0].completion_tokens
    # The drain is charged when it ends: the bucket holds tpm - drained then, and refills.
    tpm_window = steady_tpm.outcomes[-1].started - drain.outcomes[0].ended
    expected_tokens = tpm - drained + tpm * tpm_window / 60
    print(f"tpm {tpm}: drained with {drained} tokens, {len(steady_tpm.outcomes)} sent in {tpm_window:.1f} s, "
          f"{steady_tpm.admitted} admitted, {tokens} tokens, expected {expected_tokens:.0f} "
          f"(+ up to one request of {per_request})")  # fmt: skip
    # A request is admitted while the bucket is above zero and charged when it ends: the
    # last one admitted may take it below zero by its own size.
    assert within(tokens, expected_tokens, slack=per_request), (tokens, expected_tokens)
    assert steady_rpm.limited > 0 and steady_tpm.limited > 0


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
