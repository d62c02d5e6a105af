"""One policy: ``switchyard policy push`` reaches all three gateways within the reload
interval (0.5 s in the bed), and ``/readyz`` and ``/admin/fleet`` show one digest."""

from __future__ import annotations

import time

import pytest

from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import FleetBed, admin, http

pytestmark = pytest.mark.fleet


def test_a_push_reaches_every_gateway_within_the_reload_interval(bed: FleetBed) -> None:
    old = {http("GET", g.url + "/readyz")["policy"]["digest"] for g in bed.gateways}
    assert len(old) == 1
    figures = checks.policy_push(bed, comment="edited")
    print(f"policy push: {figures}")
    assert figures["digest"] not in old
    # Two policies live at once for at most one reload interval (+ a poll of slack here).
    assert figures["ok"], figures
    for g in bed.gateways:
        assert http("GET", g.url + "/readyz")["policy"]["origin"] == "redis"
    deadline = time.monotonic() + 5
    while admin(bed.gateways[0].url, "/admin/fleet")["policies"] != {figures["digest"]: 3}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
