"""Serving the simulator on a socket from a running event loop."""

from __future__ import annotations

from aiohttp import web

from local_backend.sim._app import create_app
from local_backend.sim._config import SimConfig
from local_backend.sim._state import SIM_STATE, SimState

SHUTDOWN_TIMEOUT_S = 1.0


class RunningSim:
    """A simulator serving on a socket; :meth:`stop` ends it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self.runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """``http://host:port`` (the control API and ``/health`` live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``.../v1``."""
        return self.url + "/v1"

    @property
    def state(self) -> SimState:
        """The live state (for in-process tests)."""
        return self.runner.app[SIM_STATE]

    async def stop(self) -> None:
        """Close the listener and every open connection (hanging requests included)."""
        await self.runner.cleanup()


async def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 8001) -> RunningSim:
    """Start serving ``config`` on ``host:port`` (0: a free port, see ``.port``)."""
    # No access log: it would cost more than a simulated request.
    runner = web.AppRunner(
        create_app(config), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if port == 0 and runner.addresses else port
    return RunningSim(runner, host, int(bound))
