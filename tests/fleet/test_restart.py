"""Rolling restart under load, as Kubernetes does it: each gateway in turn leaves the load
balancer's rotation (its endpoint removed during the preStop pause), gets SIGTERM, drains
its in-flight streams, and comes back. No request fails; every stream ends with [DONE]."""

from __future__ import annotations

import pytest

from gateway.tools.fleet import checks
from gateway.tools.fleet.bed import FleetBed

pytestmark = pytest.mark.fleet


def test_a_rolling_restart_under_load_fails_no_request(bed: FleetBed) -> None:
    figures = checks.rolling_restart(bed)
    print(f"rolling restart: {figures}")
    assert figures["failed"] == 0 and figures["exit_codes"] == [0, 0, 0]
    # Some streams were in flight at a SIGTERM, and all of them finished.
    assert figures["in_flight_at_sigterm"] > 0
    assert figures["in_flight_finished"] == figures["in_flight_at_sigterm"]
