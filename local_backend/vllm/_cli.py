"""``switchyard local serve CONFIG.yaml``: start and supervise vLLM replicas on this machine.

Exit status: 0 after a drain on SIGTERM/SIGINT; 2 when the config is wrong, vLLM is not
installed, or the installed vLLM refuses the launch (one line on stderr, before anything
starts); 1 when every replica failed for good.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import structlog

from gateway.replicas.launch_plan import LaunchError, has_gpu, plan_replicas
from local_backend.vllm._launch_file import load_launch_file
from local_backend.vllm._preflight import resolve_executable
from local_backend.vllm._supervisor import Supervisor


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``switchyard local ...`` to the CLI."""
    p = sub.add_parser("local", help="run local GPU model servers (vLLM)")
    lsub = p.add_subparsers(dest="local_command", required=True)
    serve = lsub.add_parser(
        "serve",
        help="start vllm serve replicas from a launch config and keep them running",
        description="Start the vLLM replicas a launch config describes (one per GPU set and port), "
        "wait for /health, restart them when they die, drain them on SIGTERM/SIGINT.",
    )
    serve.add_argument("config", help="YAML mapping of launch knobs (see README 'Local GPU backend')")
    serve.add_argument("--name", default="vllm", help="name used in logs (default vllm)")
    serve.add_argument(
        "--dry-run", action="store_true", help="print each replica's command line and exit without starting"
    )
    serve.add_argument(
        "--log-format", choices=["json", "console"], help="SWITCHYARD_LOG_FORMAT, default json"
    )
    serve.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.config import Settings
    from gateway.telemetry import logging as tlog

    try:
        launch = load_launch_file(args.config)
        plans = plan_replicas(launch, args.name, gpu=has_gpu())
    except LaunchError as exc:
        print(f"switchyard local serve: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for plan in plans:
            print(plan.command_line())
        return 0
    try:
        # Before logging is set up: a missing vLLM is one line on stderr, not a log record.
        resolve_executable(launch.executable, os.environ)
    except LaunchError as exc:
        print(f"switchyard local serve: {exc}", file=sys.stderr)
        return 2
    settings = Settings.from_env(log_format=args.log_format)
    tlog.configure(settings.log_level, settings.log_format)
    try:
        return asyncio.run(_serve(Supervisor({args.name: launch})))
    except LaunchError as exc:
        print(f"switchyard local serve: {exc}", file=sys.stderr)
        return 2
    finally:
        tlog.shutdown()


async def _serve(supervisor: Supervisor) -> int:
    log = structlog.get_logger("switchyard.vllm")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await supervisor.check()  # refused -> LaunchError -> exit 2, nothing started
    await supervisor.start()
    for name, plans in supervisor.plans.items():
        log.info("local_serve_started", deployment=name, urls=[p.base_url for p in plans])
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if supervisor.failed():
            log.error("local_serve_failed", status=supervisor.status())
            await supervisor.stop()
            return 1
    log.info("local_serve_stopping")
    await supervisor.stop()
    return 0
