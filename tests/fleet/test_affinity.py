"""Replica affinity agrees across gateways: a stable prefix goes to the same simulator host
from every gateway, so it is warmed once per fleet; the prefix-cache hit rate is the same
with one gateway and with three."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from gateway.tools.fleet.bed import FleetBed, http
from gateway.tools.fleet.load import LoadResult, chat_body, run_load

pytestmark = pytest.mark.fleet

PREFIXES = [
    f"You are affinity assistant {i}. " + "Keep to the fleet's house style in every answer. " * 30
    for i in range(8)
]
ROUNDS = 3


def workload(gateways: list[str], key: str, tag: str) -> LoadResult:
    # Request i: prefix i % 8, through gateway i % len(gateways); slow enough that no
    # replica's load bound makes a prefix spill.
    def body(i: int) -> dict[str, object]:
        return chat_body(PREFIXES[i % len(PREFIXES)], f"{tag} question {i}")

    return asyncio.run(
        run_load(
            lambda: gateways, key, body, rate_per_s=15, duration_s=len(PREFIXES) * ROUNDS * 3 / 15, tag=tag
        )
    )


def served_by(bed: FleetBed) -> dict[str, int]:
    out = {}
    for index, sim in enumerate(bed.sims):
        for entry in http("GET", sim.url + "/sim/stats")["recent"]:
            out[entry["x-request-id"]] = index
    return out


def hit_rate(result: LoadResult) -> float:
    prompt, cached, _ = result.tokens()
    return cached / prompt


def test_a_prefix_goes_to_one_simulator_from_every_gateway(bed: FleetBed) -> None:
    key = bed.create_key("affinity")
    gateways = [g.url for g in bed.gateways]
    rates = {}
    for label, targets in (("one", gateways[:1]), ("three", gateways)):
        for sim in bed.sims:
            http("POST", sim.url + "/sim/reset", {})
        result = workload(targets, key, label)
        assert not result.failed and result.admitted == len(result.outcomes)
        rates[label] = hit_rate(result)
        homes: dict[int, set[int]] = defaultdict(set)
        where = served_by(bed)
        for i, outcome in enumerate(result.outcomes):
            homes[i % len(PREFIXES)].add(where[outcome.request_id])
        assert all(len(h) == 1 for h in homes.values()), dict(homes)
        assert len({next(iter(h)) for h in homes.values()}) == len(bed.sims)  # both hosts used
    print(f"prefix-cache hit rate (tokens): 1 gateway {rates['one']:.3f}, 3 gateways {rates['three']:.3f}")
    # Each prefix is warmed once per fleet: three gateways miss no more than one does.
    assert rates["three"] >= rates["one"] - 0.01
