"""One policy: ``switchyard policy push`` reaches all three gateways within the reload
interval (0.5 s in the bed), and ``/readyz`` and ``/admin/fleet`` show one digest."""

from __future__ import annotations

import time

import pytest

from gateway.tools.fleet.bed import FleetBed, admin, fleet_policy, http

pytestmark = pytest.mark.fleet
RELOAD_INTERVAL_S = 0.5


def test_a_push_reaches_every_gateway_within_the_reload_interval(bed: FleetBed) -> None:
    old = {http("GET", g.url + "/readyz")["policy"]["digest"] for g in bed.gateways}
    assert len(old) == 1
    digest = bed.push_policy(fleet_policy([s.url for s in bed.sims], comment="edited"))
    pushed = time.monotonic()
    assert digest not in old
    swapped: dict[str, float] = {}
    while len(swapped) < len(bed.gateways) and time.monotonic() - pushed < 5:
        for g in bed.gateways:
            if g.name not in swapped and http("GET", g.url + "/readyz")["policy"]["digest"] == digest:
                swapped[g.name] = time.monotonic()
        time.sleep(0.01)
    assert len(swapped) == len(bed.gateways), swapped
    spread = max(swapped.values()) - min(swapped.values())
    print(f"policy push: last gateway swapped {max(swapped.values()) - pushed:.3f} s after the push "
          f"returned; first-to-last spread {spread:.3f} s")  # fmt: skip
    # Two policies live at once for at most one reload interval (+ a poll of slack here).
    assert spread <= RELOAD_INTERVAL_S + 0.2
    for g in bed.gateways:
        status = http("GET", g.url + "/readyz")["policy"]
        assert status["origin"] == "redis"
    deadline = time.monotonic() + 5
    while admin(bed.gateways[0].url, "/admin/fleet")["policies"] != {digest: 3}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
