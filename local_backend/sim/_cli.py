"""``switchyard sim`` and ``python -m local_backend.sim``: serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from gateway.procutil import run_async
from local_backend.sim._config import add_arguments, config_from_args
from local_backend.sim._server import serve


def run(args: argparse.Namespace) -> int:
    """Serve the flags' config until SIGINT/SIGTERM (``switchyard sim``). Prints
    ``switchyard-sim listening on http://HOST:PORT`` once it listens."""
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"switchyard sim: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        running = await serve(config, args.host, args.port)
        print(f"switchyard-sim listening on {running.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await running.stop()

    try:
        run_async(main())
    except OSError as exc:  # the port is taken, the host does not exist, ...
        print(f"switchyard sim: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m local_backend.sim [flags]``."""
    parser = argparse.ArgumentParser(prog="switchyard sim", description="OpenAI-compatible simulator")
    add_arguments(parser)
    return run(parser.parse_args(argv))
