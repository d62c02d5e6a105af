"""Replica affinity agrees across gateways: a stable prefix goes to the same simulator host
from every gateway, so it is warmed once per fleet; the prefix-cache hit rate is the same
with one gateway and with three."""

from __future__ import annotations

import pytest

from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import FleetBed

pytestmark = pytest.mark.fleet


def test_a_prefix_goes_to_one_simulator_from_every_gateway(bed: FleetBed) -> None:
    figures = checks.affinity(bed)
    print(f"affinity: {figures}")
    # Every prefix stayed on one host through one gateway and through three, both hosts used.
    assert figures["ok"], figures
    assert figures["homes_one"] == figures["homes_all"] == len(bed.sims)
    # Each prefix is warmed once per fleet: three gateways miss no more than one does.
    assert figures["hit_rate_all"] >= figures["hit_rate_one"] - 0.01
