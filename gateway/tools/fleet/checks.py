"""What ``switchyard fleet-test`` measures on a running :class:`~gateway.tools.fleet.bed.FleetBed`
(tests/fleet/ asserts on the same figures). Each check returns a flat dict of figures and
``ok``; call them on the load-generator host (inside ``bed.inside()``)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gateway.tools.fleet.bed import FleetBed, admin, fleet_policy, http
from gateway.tools.fleet.load import LoadResult, chat_body, run_load

RPM_SYSTEM = "You are terse."


def fleet_view(bed: FleetBed, settle_s: float = 5.0) -> dict[str, Any]:
    """``/admin/fleet`` from every gateway: the live gateways and policy digests each lists,
    once all agree on every gateway and one policy (or as they stand after ``settle_s``)."""
    started = time.monotonic()
    while True:
        views = [admin(g.url, "/admin/fleet") for g in bed.gateways]
        live = [v["live"] for v in views]
        policies = [len(v["policies"]) for v in views]
        ok = all(n == len(bed.gateways) for n in live) and all(p == 1 for p in policies)
        if ok or time.monotonic() - started > settle_s:
            return {"ok": ok, "live_seen_by_each": live, "policies_seen_by_each": policies,
                    "settled_s": round(time.monotonic() - started, 2)}  # fmt: skip
        time.sleep(0.1)


def policy_push(bed: FleetBed, comment: str = "fleet-test") -> dict[str, Any]:
    """Push an edited policy; when each gateway's ``/readyz`` reports it. ``spread_s`` is how
    long two policies were live at once (as seen by polling every 10 ms)."""
    started = time.monotonic()
    digest = bed.push_policy(fleet_policy([s.url for s in bed.sims], comment=comment))
    pushed = time.monotonic()
    swapped: dict[str, float] = {}
    while len(swapped) < len(bed.gateways) and time.monotonic() - pushed < 10:
        for g in bed.gateways:
            if g.name not in swapped and http("GET", g.url + "/readyz")["policy"]["digest"] == digest:
                swapped[g.name] = time.monotonic()
        time.sleep(0.01)
    if len(swapped) < len(bed.gateways):
        return {"ok": False, "digest": digest, "swapped": len(swapped)}
    spread = max(swapped.values()) - min(swapped.values())
    interval = float(bed.gateway_settings["SWITCHYARD_RELOAD_INTERVAL_S"])
    return {
        "ok": spread <= interval + 0.2,
        "digest": digest,
        "push_command_s": round(pushed - started, 3),
        "last_swap_after_push_s": round(max(swapped.values()) - pushed, 3),
        "spread_s": round(spread, 3),
        "reload_interval_s": interval,
    }


def limits(bed: FleetBed, rpm: int = 60, steady_s: float = 20.0) -> dict[str, Any]:
    """Two keys hit at three times their limit, round robin over every gateway, for
    ``steady_s``: one limited to ``rpm`` (emptied first by a burst of a minute's requests),
    one to a TPM worth ``rpm`` requests a minute (emptied first by one request as large as
    its minute). ``expected`` is what one token bucket allows; ``ok`` when each is within
    2 % of its limit (TPM: plus the last request, charged when it ends) and nothing
    failed."""
    gateways = [g.url for g in bed.gateways]
    stamp = time.time_ns()
    probe = asyncio.run(
        run_load(lambda: gateways, bed.create_key(f"probe-{stamp}"), lambda i: chat_body(RPM_SYSTEM, "q 0"),
                 rate_per_s=1, duration_s=1)
    )  # fmt: skip
    per_request = probe.outcomes[0].prompt_tokens + probe.outcomes[0].completion_tokens
    tpm = rpm * per_request
    rpm_key = bed.create_key(f"rpm-{stamp}", rpm=rpm)
    tpm_key = bed.create_key(f"tpm-{stamp}", tpm=tpm)

    def body(i: int) -> dict[str, Any]:
        return chat_body(RPM_SYSTEM, f"q {i % 10}")  # the same size every time

    async def main() -> list[LoadResult]:
        burst = await run_load(
            lambda: gateways, rpm_key, body, rate_per_s=400, duration_s=rpm / 400, tag="burst"
        )
        big = chat_body("x " * (2 * tpm), "q")  # the simulator counts ~4 characters a token
        drain = await run_load(
            lambda: gateways, tpm_key, lambda i: big, rate_per_s=1, duration_s=1, tag="drain"
        )
        rate = 3 * rpm / 60
        steady = await asyncio.gather(
            run_load(lambda: gateways, rpm_key, body, rate_per_s=rate, duration_s=steady_s, tag="rpm"),
            run_load(lambda: gateways, tpm_key, body, rate_per_s=rate, duration_s=steady_s, tag="tpm"),
        )
        return [burst, drain, *steady]

    burst, drain, by_rpm, by_tpm = asyncio.run(main())
    failed = sum(len(r.failed) for r in (burst, drain, by_rpm, by_tpm))
    window_s = by_rpm.outcomes[-1].started - burst.outcomes[0].started
    expected = rpm * window_s / 60
    tokens = sum(o.prompt_tokens + o.completion_tokens for o in by_tpm.outcomes if o.ok)
    drained = drain.outcomes[0].prompt_tokens + drain.outcomes[0].completion_tokens
    # The drain is charged when it ends: the bucket holds tpm - drained then, and refills.
    # A request is admitted while the bucket is above zero and charged when it ends, so
    # the last one admitted may take it below zero by its own size.
    tpm_window_s = by_tpm.outcomes[-1].started - drain.outcomes[0].ended
    expected_tokens = tpm - drained + tpm * tpm_window_s / 60
    # Within 2 % of the limit (R, T a minute), as the acceptance asks.
    rpm_ok = burst.admitted == rpm and abs(by_rpm.admitted - expected) <= 0.02 * rpm
    tpm_ok = abs(tokens - expected_tokens) <= 0.02 * tpm + per_request
    return {
        "ok": failed == 0 and rpm_ok and tpm_ok and by_rpm.limited > 0 and by_tpm.limited > 0,
        "failed": failed,
        "rpm": rpm,
        "rpm_burst_admitted": burst.admitted,
        "rpm_sent": len(by_rpm.outcomes),
        "rpm_window_s": round(window_s, 2),
        "rpm_admitted": by_rpm.admitted,
        "rpm_expected": round(expected, 1),
        "tpm": tpm,
        "tpm_request_tokens": per_request,
        "tpm_sent": len(by_tpm.outcomes),
        "tpm_window_s": round(tpm_window_s, 2),
        "tpm_admitted_tokens": tokens,
        "tpm_expected_tokens": round(expected_tokens),
    }


AFFINITY_PREFIXES = [
    f"You are affinity assistant {i}. " + "Keep to the fleet's house style in every answer. " * 30
    for i in range(8)
]


def affinity(bed: FleetBed, rounds: int = 3) -> dict[str, Any]:
    """Eight stable prefixes sent ``rounds`` times through one gateway, then (the caches
    emptied) through all, round robin:
    whether each prefix stayed on one simulator host, and the prefix-cache hit rate
    (cached / prompt tokens, as the answers' usage reported) of each run."""
    key = bed.create_key(f"affinity-{time.time_ns()}")
    gateways = [g.url for g in bed.gateways]
    out: dict[str, Any] = {"ok": True}
    for label, targets in (("one", gateways[:1]), ("all", gateways)):
        for sim in bed.sims:
            http("POST", sim.url + "/sim/reset", {})

        def body(i: int, label: str = label) -> dict[str, Any]:
            return chat_body(AFFINITY_PREFIXES[i % len(AFFINITY_PREFIXES)], f"{label} question {i}")

        count = len(AFFINITY_PREFIXES) * rounds  # the same workload for one gateway and for all
        result = asyncio.run(
            run_load(_fixed(targets), key, body, rate_per_s=15, duration_s=count / 15, tag=f"aff-{label}")
        )
        homes = served_by(bed, result, len(AFFINITY_PREFIXES))
        prompt, cached, _ = result.tokens()
        out[f"hit_rate_{label}"] = round(cached / prompt, 3) if prompt else 0.0
        out[f"homes_{label}"] = len({next(iter(h)) for h in homes.values() if len(h) == 1})
        out["ok"] = out["ok"] and not result.failed and all(len(h) == 1 for h in homes.values())
    out["ok"] = out["ok"] and out["hit_rate_all"] >= out["hit_rate_one"] - 0.01
    return out


def _fixed(targets: list[str]) -> Callable[[], list[str]]:
    return lambda: targets


def served_by(
    bed: FleetBed, result: LoadResult, prefixes: int, cut: int | None = None
) -> dict[int, set[int]]:
    """Prefix (request ``i`` has prefix ``i % prefixes``) -> the simulators that answered it,
    from their ``/sim/stats``; -1 for one that cannot be asked (``cut``)."""
    where = {}
    for index, sim in enumerate(bed.sims):
        if index == cut:
            continue
        for entry in http("GET", sim.url + "/sim/stats")["recent"]:
            where[entry["x-request-id"]] = index
    homes: dict[int, set[int]] = defaultdict(set)
    for i, o in enumerate(result.outcomes):
        if o.ok:
            homes[i % prefixes].add(where.get(o.request_id, -1))
    return homes


def rolling_restart(bed: FleetBed, prestop_s: float = 0.2, rate_per_s: float = 6) -> dict[str, Any]:
    """Streams at ``rate_per_s`` while each gateway in turn leaves the rotation, waits
    ``prestop_s``, gets SIGTERM, drains and comes back: failures, streams in flight at a
    SIGTERM (all must finish), exit codes."""
    key = bed.create_key(f"restart-{time.time_ns()}")
    rotation = [g.url for g in bed.gateways]
    terms: dict[str, float] = {}
    exit_codes: list[int | None] = []

    def roll() -> None:
        time.sleep(1.5)
        for node in bed.gateways:
            rotation.remove(node.url)
            time.sleep(prestop_s)
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

        def body(i: int) -> dict[str, Any]:
            return chat_body(f"restart prefix {i % 5}", f"q {i}", stream=True, model="slow")

        roller = asyncio.create_task(rolling())
        result = await run_load(
            lambda: rotation, key, body, rate_per_s=rate_per_s, duration_s=600, until=done
        )
        await roller
        return result

    result = asyncio.run(main())
    caught = [o for o in result.outcomes if o.gateway in terms and o.started < terms[o.gateway] < o.ended]
    return {
        "ok": not result.failed and all(c == 0 for c in exit_codes) and all(o.ok for o in caught),
        "streams": len(result.outcomes),
        "failed": len(result.failed),
        "in_flight_at_sigterm": len(caught),
        "in_flight_finished": sum(1 for o in caught if o.ok),
        "exit_codes": exit_codes,
    }
