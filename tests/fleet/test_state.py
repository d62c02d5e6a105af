"""Stored state is the fleet's: a Responses conversation made on one gateway continues on
another and reads back from the third (stored responses live in the Redis Cluster)."""

from __future__ import annotations

import pytest

from gateway.tools.fleet.bed import FleetBed, http

pytestmark = pytest.mark.fleet


def test_previous_response_id_works_on_every_gateway(bed: FleetBed) -> None:
    key = bed.create_key("responses")
    auth = {"Authorization": f"Bearer {key}"}
    g1, g2, g3 = (g.url + "/v1/responses" for g in bed.gateways)
    first = http("POST", g1, {"model": "fast", "input": "My name is Ada."}, auth)
    second = http(
        "POST", g2, {"model": "fast", "input": "What is my name?", "previous_response_id": first["id"]}, auth
    )
    assert second["previous_response_id"] == first["id"] and second["status"] == "completed"
    third = http(
        "POST", g3, {"model": "fast", "input": "And again?", "previous_response_id": second["id"]}, auth
    )
    assert third["status"] == "completed"
    for url in (g1, g2, g3):
        assert http("GET", f"{url}/{first['id']}", headers=auth)["id"] == first["id"]
        assert http("GET", f"{url}/{third['id']}", headers=auth)["previous_response_id"] == second["id"]
    # Each gateway sent the history it read from Redis: every turn's input is longer.
    sizes = [r["usage"]["input_tokens"] for r in (first, second, third)]
    assert sizes[0] < sizes[1] < sizes[2], sizes
