"""Stored state is the fleet's: a Responses conversation made on one gateway continues on
another and reads back from the third (stored responses live in the Redis Cluster), and
the shadow samples of all three gateways land in the one list the judge and the fit read."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from redis.cluster import RedisCluster

from gateway.routing.shadow import PAIRS_KEY
from gateway.tools.fleet.bed import FleetBed, fleet_policy, http
from gateway.tools.fleet.load import chat_body, run_load

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


SHADOW_ALL = """routing:
  classifier: {name: linear, bias: -2.0, weights: {reasoning_cues: 10.0}}
  threshold: 0.5
  shadow: {share: 1.0, max_per_minute: 1000}
"""


def test_every_gateways_shadow_samples_land_in_one_place(bed: FleetBed) -> None:
    sims = [s.url for s in bed.sims]
    bed.push_policy(fleet_policy(sims, comment="shadow", extra=SHADOW_ALL))
    time.sleep(1.0)  # one reload interval (0.5 s) and slack
    try:
        key = bed.create_key("shadow")
        gateways = [g.url for g in bed.gateways]

        def body(i: int) -> dict[str, object]:
            return chat_body("Be brief.", f"Hello number {i}", model="auto")

        result = asyncio.run(run_load(lambda: gateways, key, body, rate_per_s=6, duration_s=2, tag="shadow"))
        assert not result.failed
        sent = {o.request_id: o.gateway for o in result.outcomes}
        first = bed.redis[0]
        cluster = RedisCluster(host=first.host.address, port=first.port)
        deadline = time.monotonic() + 15
        while True:
            pairs = [orjson.loads(raw) for raw in cluster.lrange(PAIRS_KEY, 0, -1)]
            mine = [p for p in pairs if p.get("id") in sent]
            if len(mine) == len(sent) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        cluster.close()
        # The judge and the fit read this one list: it holds every gateway's samples.
        assert len(mine) == len(sent)
        assert {sent[p["id"]] for p in mine} == set(gateways)
    finally:
        bed.push_policy(fleet_policy(sims))
