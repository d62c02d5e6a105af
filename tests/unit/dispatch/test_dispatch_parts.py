"""Circuit breaker, budgets, timeouts and failure reasons, alone."""

from __future__ import annotations

import random

import pytest

from gateway.dispatch.budget import Budget, LatencyWindow
from gateway.dispatch.circuit import Breakers
from gateway.dispatch.clock import ManualClock
from gateway.dispatch.dispatcher import failure_reason, tighten
from gateway.dispatch.failures import status_error
from gateway.dispatch.fanout import timeout_override
from gateway.dispatch.policy import CircuitPolicy, Timeouts
from gateway.errors import InvalidRequestError, UpstreamError, UpstreamTimeoutError

CLOCK = ManualClock()


def breakers(**kwargs: object) -> Breakers:
    b = Breakers(CLOCK)
    b.configure(CircuitPolicy(shared=False, **kwargs))  # type: ignore[arg-type]
    return b


def test_circuit_opens_after_consecutive_failures_and_probes_after_cooldown() -> None:
    b = breakers(consecutive_failures=3, cooldown_s=0.2)
    for _ in range(2):
        assert b.available("d")
        b.record("d", False)
    assert b.available("d")
    b.record("d", False)
    assert not b.available("d") and b.is_open("d")
    CLOCK.advance(0.25)
    assert b.available("d")  # the half-open probe
    assert not b.available("d")  # only one probe at a time
    b.record("d", True)
    assert b.available("d") and b.status()["d"]["state"] == "closed"
    assert b.transitions == {("d", "open"): 1, ("d", "half_open"): 1, ("d", "closed"): 1}


def test_failed_probe_opens_again() -> None:
    b = breakers(consecutive_failures=1, cooldown_s=0.1)
    b.record("d", False)
    CLOCK.advance(0.15)
    assert b.available("d")
    b.record("d", False)
    assert b.is_open("d")


def test_circuit_opens_on_failure_rate() -> None:
    b = breakers(consecutive_failures=100, failure_rate=0.5, min_requests=10)
    for i in range(9):
        b.record("d", i % 2 == 0)  # 4 failures in 9
    assert not b.is_open("d")
    b.record("d", False)  # 5 of 10
    assert b.is_open("d")


def test_failures_that_left_the_window_no_longer_count_towards_the_rate() -> None:
    b = breakers(consecutive_failures=100, failure_rate=0.5, min_requests=10, window_s=10)
    for _ in range(4):
        b.record("d", False)
        b.record("d", True)  # 4 failures in 8, none consecutive enough
    CLOCK.advance(11)  # they age out
    for _ in range(4):
        b.record("d", True)
    b.record("d", False)
    b.record("d", False)  # 2 of the window's 6: without the ageing, 6 of 14 and then 7 of 15
    assert not b.is_open("d")
    status = b.status()["d"]
    assert (status["window_attempts"], status["window_failures"]) == (6, 2)


def test_the_windows_counts_match_a_count_of_its_attempts() -> None:
    """Kept as attempts come and go, the counts equal a count over the window, whenever read."""
    rng = random.Random(3)
    b = breakers(consecutive_failures=10**6, failure_rate=1.0, min_requests=10**6, window_s=5)
    seen: list[tuple[float, bool]] = []
    for _ in range(3_000):
        CLOCK.advance(rng.choice((0.0, 0.001, 0.01, 0.5, 2.0)))
        ok = rng.random() < 0.7
        b.record("d", ok)
        seen.append((CLOCK.now(), ok))
        if rng.random() < 0.05:
            CLOCK.advance(rng.random() * 3)
            recent = [good for t, good in seen if t >= CLOCK.now() - 5]
            status = b.status()["d"]
            assert (status["window_attempts"], status["window_failures"]) == (
                len(recent),
                recent.count(False),
            )


def test_an_abandoned_probe_frees_its_slot() -> None:
    b = breakers(consecutive_failures=1, cooldown_s=0.05)
    b.record("d", False)
    CLOCK.advance(0.1)
    assert b.available("d")
    b.abandon("d")
    assert b.available("d")


def test_disabled_circuits_never_open() -> None:
    b = breakers(enabled=False, consecutive_failures=1)
    b.record("d", False)
    assert b.available("d")


def test_budget_allows_a_share_of_requests() -> None:
    budget = Budget(ratio=0.2, min_per_s=0.0, window_s=10)
    for _ in range(10):
        budget.note_request()
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    assert budget.spent == 2 and budget.refused == 1


def test_budget_minimum_per_second() -> None:
    budget = Budget(ratio=0.0, min_per_s=0.5, window_s=4)
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]


def test_latency_p95() -> None:
    window = LatencyWindow()
    assert window.p95() is None
    for i in range(1, 101):
        window.add(i / 100)
    assert window.p95() == pytest.approx(0.95)


def test_request_timeouts_only_tighten() -> None:
    policy = Timeouts(connect_s=5, first_token_s=60, idle_s=None, total_s=600)
    override = timeout_override("first_token_s=2, total_s=900, idle_s=1.5")
    assert override is not None
    t = tighten(policy, override)
    assert (t.connect_s, t.first_token_s, t.idle_s, t.total_s) == (5, 2, 1.5, 600)
    assert tighten(policy, None) is policy
    assert timeout_override("total_s=250ms") == Timeouts(total_s=0.25)
    for bad in ("first_token=2", "total_s=soon", "total_s=-1"):
        with pytest.raises(InvalidRequestError) as info:
            timeout_override(bad)
        assert info.value.param == "x-switchyard-timeout"


def test_failure_reasons() -> None:
    assert failure_reason(status_error("d", 503, b"", {})) == "503"
    assert failure_reason(status_error("d", 429, b"", {})) == "429"
    assert failure_reason(status_error("d", 400, b"{}", {})) == "400"
    assert failure_reason(UpstreamError("x", code="connect_failed")) == "connect"
    assert failure_reason(UpstreamTimeoutError("x", code="first_token_timeout")) == "first_token_timeout"
