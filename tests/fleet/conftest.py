"""One fleet test bed for the whole fleet job (marker ``fleet``): three gateway hosts, a
three-master Redis Cluster with a replica each, two simulator hosts and the load generator,
each a network namespace (loopback addresses 127.0.0.x where namespaces cannot be made).
The tests run on the load-generator host; those that break something run last."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gateway.tools.fleet.bed import FleetBed
from gateway.tools.fleet.net import Topology
from tests.helpers import OUTPUT_DIR

# Order in which the files run: the ones that stop, cut or kill things last.
ORDER = [
    "test_views",
    "test_policy",
    "test_limits",
    "test_affinity",
    "test_state",
    "test_restart",
    "test_outages",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items: only this folder's are ranked (a stable sort
    # leaves every other test where it was).
    def rank(item: pytest.Item) -> int:
        path, _, _ = item.nodeid.partition("::")
        if not path.startswith("tests/fleet/"):
            return len(ORDER)
        name = path.rsplit("/", 1)[-1].removesuffix(".py")
        return ORDER.index(name) if name in ORDER else len(ORDER)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def bed() -> Iterator[FleetBed]:
    workdir = OUTPUT_DIR / "fleet"
    workdir.mkdir(parents=True, exist_ok=True)
    topology = Topology(prefix=f"syf{os.getpid() % 10000}")
    if not topology.isolated:
        print(f"fleet: network namespaces unavailable ({topology.why_not}): hosts are 127.0.0.x addresses")
    fleet = FleetBed(topology, workdir)
    with fleet.running(), fleet.inside():
        yield fleet
