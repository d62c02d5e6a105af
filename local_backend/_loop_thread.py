"""One service on its own event loop in a daemon thread, for a synchronous owner.

The simulator in a test (:class:`local_backend.sim.SimThread`) and the vLLM supervisor in
the gateway's runner (:class:`local_backend.vllm.SupervisorThread`) both need the same
thing: start a service on a private loop, wait until it is up (or re-raise why it could
not start), reach into it from the owning thread, and stop it so its cleanup runs on
its own loop before the thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """``start(setup, teardown)`` runs ``setup()`` on a new loop in a daemon thread and
    returns once it finished; the loop then idles until :meth:`stop`, which runs
    ``teardown()`` there and joins the thread."""

    def __init__(
        self, name: str, loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    ) -> None:
        self._name = name
        self._loop_factory = loop_factory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Started, set up, and not yet stopped."""
        loop = self._loop
        return self._ready.is_set() and self._error is None and loop is not None and not loop.is_closed()

    def start(
        self,
        setup: Callable[[], Awaitable[None]],
        teardown: Callable[[], Awaitable[None]],
        timeout_s: float = 10.0,
    ) -> None:
        """Start the thread and wait until ``setup()`` returned; its exception is raised here."""

        async def main() -> None:
            self._stop = asyncio.Event()
            try:
                await setup()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await teardown()

        def run() -> None:
            loop = self._loop_factory()
            self._loop = loop
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"{self._name} did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        """Run ``coro`` on the thread's loop and return its result (RuntimeError when the
        loop is not running, TimeoutError after ``timeout_s``)."""
        loop = self._loop
        if not self.running or loop is None:
            coro.close()
            raise RuntimeError(f"{self._name} is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def stop(self, join_timeout_s: float = 10.0) -> None:
        """Ask the loop to run the teardown, and wait up to ``join_timeout_s`` for the thread."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if thread is None:
            return
        if loop is not None and stop is not None and thread.is_alive():
            # The loop may close between the check and the call: then there is nothing to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        thread.join(join_timeout_s)
