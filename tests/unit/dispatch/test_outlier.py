"""Timeouts are judged against the deployment's peers (issue #50, item 10): a busy machine
that slows every deployment of a tier opens no circuit, one deployment that is down does,
and timeouts alone never open every deployment of a tier."""

from __future__ import annotations

from gateway.dispatch.circuit import Breakers, tier_open_cap
from gateway.dispatch.clock import ManualClock
from gateway.dispatch.policy import CircuitPolicy

TIMEOUT = "first_byte_timeout"


def tier(*names: str, **policy: object) -> tuple[Breakers, ManualClock]:
    clock = ManualClock()
    breakers = Breakers(clock)
    breakers.configure(CircuitPolicy(shared=False, **policy))  # type: ignore[arg-type]
    breakers.set_tiers([list(names)])
    breakers.watch(list(names))
    return breakers, clock


def succeed(breakers: Breakers, clock: ManualClock, name: str, n: int) -> None:
    for _ in range(n):
        breakers.record(name, True, started_at=clock.now() - 0.2)
        clock.advance(0.05)


def time_out(breakers: Breakers, clock: ManualClock, name: str, n: int) -> None:
    for _ in range(n):
        # Each attempt started after the latest success ended: these count as consecutive.
        breakers.record(name, False, started_at=clock.now(), reason=TIMEOUT)
        clock.advance(0.05)


def test_two_deployments_both_slowed_to_ten_percent_timeouts_stay_closed() -> None:
    breakers, clock = tier("a", "b")
    for _ in range(2):
        succeed(breakers, clock, "a", 45)
        succeed(breakers, clock, "b", 45)
        # The busy machine: a burst of 5 timeouts in a row on each, 10 % of their attempts.
        for _ in range(5):
            time_out(breakers, clock, "a", 1)
            time_out(breakers, clock, "b", 1)
    status = breakers.status()
    assert status["a"]["consecutive_failures"] >= 5 and status["b"]["consecutive_failures"] >= 5
    assert status["a"]["window_failures"] / status["a"]["window_attempts"] <= 0.1
    assert not breakers.is_open("a") and not breakers.is_open("b")
    assert breakers.transitions == {}


def test_the_deployment_that_fails_all_while_its_peer_is_fine_opens() -> None:
    breakers, clock = tier("a", "b")
    succeed(breakers, clock, "b", 20)
    time_out(breakers, clock, "a", 5)
    assert breakers.is_open("a") and not breakers.is_open("b")


def test_timeouts_alone_never_open_every_deployment_of_a_tier() -> None:
    breakers, clock = tier("a", "b")
    time_out(breakers, clock, "a", 5)
    assert breakers.is_open("a")
    time_out(breakers, clock, "b", 20)  # as bad, but the last one of the tier left
    assert not breakers.is_open("b")


def test_other_failures_still_open_the_circuit_whatever_the_peers() -> None:
    breakers, clock = tier("a", "b")
    for name in ("a", "b"):
        for _ in range(5):
            breakers.record(name, False, started_at=clock.now(), reason="503")
            clock.advance(0.05)
    assert breakers.is_open("a") and breakers.is_open("b")  # down, not slow: panic routing takes over


def test_a_deployment_outside_any_tier_keeps_the_absolute_rules() -> None:
    breakers, clock = tier("a", "b")
    time_out(breakers, clock, "solo", 5)
    assert breakers.is_open("solo")


def test_the_share_of_a_tier_open_for_timeouts_is_capped() -> None:
    assert [tier_open_cap(size, 0.5) for size in (1, 2, 3, 4, 10)] == [0, 1, 1, 2, 5]
    assert tier_open_cap(10, 0.0) == 1 and tier_open_cap(3, 1.0) == 2
    breakers, clock = tier("a", "b", "c", "d")
    for name in ("a", "b", "c"):
        time_out(breakers, clock, name, 5)
    succeed(breakers, clock, "d", 5)
    assert [breakers.is_open(n) for n in "abcd"] == [True, True, False, False]
