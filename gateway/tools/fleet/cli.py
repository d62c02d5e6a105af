"""``switchyard fleet-test``: build the fleet test bed (network namespaces, or loopback
addresses where they cannot be made), run the checks of :mod:`gateway.tools.fleet.checks`
on it, print one line of figures per check, and remove everything it made."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

CHECKS = ("view", "policy", "limits", "affinity", "restart")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fleet-test",
        help="run several gateways, a Redis Cluster and simulators on namespace hosts and check they agree",
        description="Build a fleet on this machine (each host a network namespace; needs root and "
        "iproute2, else 127.0.0.x loopback addresses), run the checks and print their figures. "
        "Exit 1 if a check fails. See docs/scaling.md.",
    )
    p.add_argument("--gateways", type=int, default=3, help="gateway hosts (default 3)")
    p.add_argument("--masters", type=int, default=3, help="Redis Cluster masters (default 3, at least 3)")
    p.add_argument("--replicas", type=int, default=1, help="Redis replicas per master (default 1)")
    p.add_argument("--sims", type=int, default=2, help="simulator hosts standing in for vLLM (default 2)")
    p.add_argument("--subnet", default="10.253.0.0/24", help="host addresses, inside the namespaces only")
    p.add_argument(
        "--loopback", action="store_true", help="use 127.0.0.x addresses even where namespaces work"
    )
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)}")
    p.add_argument("--rpm", type=int, default=60, help="the limits check's requests per minute (default 60)")
    p.add_argument("--workdir", help="where logs go (default a temporary folder, kept on failure)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(func=_cmd_fleet_test)


def _cmd_fleet_test(args: argparse.Namespace) -> int:
    from gateway.tools.fleet import checks
    from gateway.tools.fleet.bed import FleetBed
    from gateway.tools.fleet.net import Topology

    wanted = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown or args.masters < 3 or min(args.gateways, args.sims) < 1:
        print(
            f"switchyard fleet-test: bad arguments: checks are {', '.join(CHECKS)}; at least 3 masters, "
            "1 gateway and 1 simulator" + (f" (unknown: {', '.join(unknown)})" if unknown else ""),
            file=sys.stderr,
        )
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="switchyard-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        topology = Topology(subnet=args.subnet, namespaces=False if args.loopback else None)
    except RuntimeError as exc:
        print(f"switchyard fleet-test: {exc}", file=sys.stderr)
        return 2
    where = "network namespaces" if topology.isolated else f"loopback 127.0.0.x ({topology.why_not})"
    print(f"fleet-test: hosts are {where}; logs in {workdir}", file=sys.stderr)
    bed = FleetBed(
        topology,
        workdir,
        gateways=args.gateways,
        masters=args.masters,
        replicas=args.replicas,
        sims=args.sims,
    )
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "view": lambda: checks.fleet_view(bed),
        "policy": lambda: checks.policy_push(bed),
        "limits": lambda: checks.limits(bed, rpm=args.rpm),
        "affinity": lambda: checks.affinity(bed),
        "restart": lambda: checks.rolling_restart(bed),
    }
    results: dict[str, dict[str, Any]] = {}
    try:
        with bed.running(), bed.inside():
            for name in wanted:
                try:
                    results[name] = runs[name]()
                except Exception as exc:  # one failed check must not hide the others' figures
                    results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                if not args.json:
                    figures = " ".join(f"{k}={v}" for k, v in results[name].items() if k != "ok")
                    print(f"{'ok  ' if results[name]['ok'] else 'FAIL'} {name}: {figures}", flush=True)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"switchyard fleet-test: the bed did not start: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.buffer.write(orjson.dumps({"isolated": topology.isolated, "checks": results}) + b"\n")
    return 0 if all(r["ok"] for r in results.values()) else 1
