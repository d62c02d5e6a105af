"""Rolling restart under load, as Kubernetes does it: each gateway in turn leaves the load
balancer's rotation (its endpoint removed during the preStop pause), gets SIGTERM, drains
its in-flight streams, and comes back. No request fails; every stream ends with [DONE]."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from gateway.tools.fleet.bed import FleetBed
from gateway.tools.fleet.load import LoadResult, chat_body, run_load

pytestmark = pytest.mark.fleet
PRESTOP_S = 0.2


def test_a_rolling_restart_under_load_fails_no_request(bed: FleetBed) -> None:
    key = bed.create_key("restart")
    rotation = [g.url for g in bed.gateways]
    terms: dict[str, float] = {}
    exit_codes: list[int | None] = []

    def roll() -> None:
        time.sleep(1.5)
        for node in bed.gateways:
            rotation.remove(node.url)
            time.sleep(PRESTOP_S)
            terms[node.url] = time.monotonic()
            node.send(signal.SIGTERM)
            exit_codes.append(node.wait(30))
            bed.restart_gateway(node)
            rotation.append(node.url)
        time.sleep(1.0)

    async def main() -> LoadResult:
        done = asyncio.Event()

        async def rolling() -> None:
            try:
                await asyncio.to_thread(roll)
            finally:
                done.set()

        def body(i: int) -> dict[str, object]:
            return chat_body(f"restart prefix {i % 5}", f"q {i}", stream=True, model="slow")

        roller = asyncio.create_task(rolling())
        result = await run_load(
            lambda: rotation, key, body, rate_per_s=6, duration_s=120, tag="roll", until=done
        )
        await roller
        return result

    rolled = asyncio.run(main())
    failed = rolled.failed
    caught = [o for o in rolled.outcomes if o.gateway in terms and o.started < terms[o.gateway] < o.ended]
    print(f"rolling restart: {len(rolled.outcomes)} streams, {len(failed)} failed, "
          f"{len(caught)} in flight at a SIGTERM finished, exit codes {exit_codes}")  # fmt: skip
    assert not failed, [(o.gateway, o.status, o.error) for o in failed[:5]]
    assert exit_codes == [0, 0, 0]
    assert caught and all(o.ok for o in caught)
