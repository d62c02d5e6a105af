"""The simulator on its own event loop in a daemon thread, for synchronous tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.procutil import new_event_loop
from local_backend._loop_thread import LoopThread
from local_backend.sim._config import SimConfig
from local_backend.sim._control import SimControl
from local_backend.sim._server import RunningSim, serve
from local_backend.sim._state import SimState


class SimThread:
    """A simulator on its own event loop in a daemon thread, for synchronous tests::

    with SimThread(SimConfig(cache_model="openai")) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x")
    """

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimConfig()
        self.host = host
        self.port = port
        self._running: RunningSim | None = None
        self._thread = LoopThread("switchyard-sim", new_event_loop)

    @property
    def url(self) -> str:
        """``http://host:port`` (the port is known once started)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``.../v1``."""
        return self.url + "/v1"

    @property
    def control(self) -> SimControl:
        """A control-API client for this simulator."""
        return SimControl(self.url)

    async def _setup(self) -> None:
        self._running = await serve(self.config, self.host, self.port)
        self.port = self._running.port

    async def _teardown(self) -> None:
        if self._running is not None:
            await self._running.stop()

    def start(self, timeout_s: float = 10.0) -> SimThread:
        """Start and wait until it listens."""
        self._thread.start(self._setup, self._teardown, timeout_s)
        return self

    def call(self, fn: Callable[[SimState], Any]) -> Any:
        """Run ``fn(state)`` on the simulator's loop and return its result."""

        async def invoke() -> Any:
            assert self._running is not None
            return fn(self._running.state)

        return self._thread.call(invoke())

    def stop(self) -> None:
        """Stop serving and join the thread."""
        self._thread.stop()

    def __enter__(self) -> SimThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
