"""Serving the app: aiohttp's connection handler answering in OpenAI's error JSON, and the
drain on SIGINT/SIGTERM (stop accepting, let what is in flight finish, cancel the rest).

Stopping always ends the process: a second SIGINT/SIGTERM during the drain, or a stop
that overruns ``drain_timeout_s`` by :data:`STOP_GRACE_S`, logs ``forced_exit`` and exits
with :data:`FORCED_EXIT_CODE` at once.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import sys
import threading
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.http.header_deadline import HeaderDeadlineHandler
from gateway.http.state import DRAINING, IN_FLIGHT, POLICY, SETTINGS

_log = structlog.get_logger("switchyard")

FORCED_EXIT_CODE = 3
"""The exit status of a stop that was forced (a second signal, or the stop overran)."""
STOP_GRACE_S = 15.0
"""How long past ``drain_timeout_s`` a stop may take before the process is ended anyway."""
_TASK_STOP_TRIES = 10


class BindError(OSError):
    """The address to listen on is taken (or not ours to take); the message says what to do."""


async def stop_task(task: asyncio.Task[Any], wait_s: float = 1.0) -> None:
    """Cancel a background task and wait for its end, cancelling again while it runs on.

    One ``cancel()`` is not always enough: on Python 3.11 ``asyncio.wait_for`` (which
    redis-py wraps around every socket write) returns its result and drops a cancellation
    that lands in the loop turn its write completes, so a ``while True`` loop such as the
    stats writer's carries on. Waiting for it without a bound is what made ``serve`` hang
    after SIGTERM. After ``_TASK_STOP_TRIES`` tries the task is left behind, logged.
    """
    for _ in range(_TASK_STOP_TRIES):
        if task.done():
            break
        task.cancel()
        await asyncio.wait({task}, timeout=wait_s)
    if not task.done():
        _log.warning("background_task_did_not_stop", task=task.get_name())
        return
    if not task.cancelled() and task.exception() is not None:
        _log.warning("background_task_failed", task=task.get_name(), error=repr(task.exception()))


class _JsonErrorHandler(HeaderDeadlineHandler):
    """aiohttp's connection handler, answering what its HTTP parser rejects (a malformed
    request line or header, an unknown Content-Encoding ...) in OpenAI's error JSON, logged
    as one line instead of a traceback; request headers have a deadline (see
    :class:`HeaderDeadlineHandler`)."""

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp logs what it could not read as a traceback; one line says as much.
        exc = sys.exc_info()[1]
        _log.info("http_connection_error", error=(str(exc).strip().splitlines() or [repr(exc)])[-1][:200])

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        reason = message or (str(exc).strip().splitlines()[-1].strip() if exc else "") or "bad request"
        _log.info("bad_http_request", status=status, reason=reason[:200])
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        err: SwitchyardError
        if status < 500:
            err = InvalidRequestError(
                f"The HTTP request could not be parsed: {reason[:200]}", code="bad_request"
            )
        else:
            err = SwitchyardError("Internal error in the gateway.")
        resp = web.Response(status=status, body=err.to_json(), content_type="application/json")
        resp.force_close()
        return resp


class _Server(web.Server):
    header_timeout_s = 10.0

    def __call__(self) -> RequestHandler:
        handler = _JsonErrorHandler(self, loop=self._loop, **self._kwargs)
        handler.header_timeout_s = self.header_timeout_s
        return handler


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        server = _Server(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        server.header_timeout_s = self.app[SETTINGS].request_header_timeout_s
        return server


async def _drain(app: web.Application, runner: _Runner, site: web.TCPSite) -> None:
    """Stop accepting; wait for the requests in flight up to the deadline; cancel the rest
    (each still answers: an error JSON, or an error event that ends its stream)."""
    deadline_s = app[SETTINGS].drain_timeout_s
    in_flight = app[IN_FLIGHT]
    app[DRAINING].set()
    _log.info("draining", pid=os.getpid(), in_flight=len(in_flight), deadline_s=deadline_s)
    await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close; busy ones after their request
    if in_flight:
        await asyncio.wait(set(in_flight), timeout=deadline_s)
    if in_flight:
        _log.warning("drain_deadline_passed", cancelled=len(in_flight))
        tasks = list(in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=2.0)


GC_GEN0_THRESHOLD = 20_000
"""Allocations between two young-generation collections once serving (CPython's default
is 700). Requests make almost no cyclic garbage, so a collection mostly walks the objects
of the requests in flight, and at 700 it ran every few requests, each walk longer the more
requests were in flight: CPU per request grew with concurrency (bench/README.md at 7e28d41, "#20").
Not higher: a collection pauses the event loop while it walks the young objects still
alive, and with many streams open (their state lives for seconds) each pause at 50,000 was
13-21 ms, which set the held streams' first-byte p99 (bench/README.md at
7e28d41, "the young generation's pauses")."""


def tune_gc() -> None:
    """Move everything built at start-up (modules, the policy, the app) out of the
    collector's reach, and collect the young generation rarely (:data:`GC_GEN0_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def bind_error(exc: OSError, host: str, port: int) -> BindError:
    """``exc`` from binding ``host:port`` as one line saying what to do."""
    if exc.errno == errno.EADDRINUSE:
        return BindError(
            exc.errno,
            f"port {port} on {host} is already in use (another gateway or server is running "
            f"there): stop it, or pick another port with --port or SWITCHYARD_PORT",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return BindError(
            exc.errno, f"no permission to listen on {host}:{port}: use a port above 1023 (--port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return BindError(
            exc.errno, f"{host} is not an address of this machine: use 127.0.0.1 or 0.0.0.0 (--host)"
        )
    return BindError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def force_exit(reason: str) -> None:
    """Log one ``forced_exit`` line and end the process now (children stop with it: each was
    started with a parent-death signal)."""
    from gateway.telemetry import logging as tlog

    _log.error("forced_exit", pid=os.getpid(), reason=reason, exit_code=FORCED_EXIT_CODE)
    tlog.shutdown()
    os._exit(FORCED_EXIT_CODE)


class _StopSignals:
    """SIGINT/SIGTERM: the first starts the drain (and a watchdog that ends a stop that
    overruns its bound), any later one forces the exit."""

    def __init__(self, bound_s: float) -> None:
        self.requested = asyncio.Event()
        self._bound_s = bound_s
        self._watchdog: threading.Timer | None = None

    def __call__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            force_exit(f"second {name} during the stop")
        self.requested.set()
        # A thread, not the loop: it fires even if the loop itself is stuck.
        self._watchdog = threading.Timer(
            self._bound_s, force_exit, args=(f"the stop took longer than {self._bound_s:g} s",)
        )
        self._watchdog.daemon = True
        self._watchdog.start()

    def cancel(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()


async def serve(app: web.Application, host: str, port: int, *, reuse_port: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let the requests and streams in
    flight finish for up to ``drain_timeout_s``, cancel what is left, and close.

    Raises :class:`BindError` when ``host:port`` cannot be bound."""
    runner = _Runner(
        app,
        handler_cancellation=True,
        access_log=None,
        # _drain has waited already; what is left gets this much more before it is cut.
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise bind_error(exc, host, port) from None
    tune_gc()
    signals = _StopSignals(app[SETTINGS].drain_timeout_s + STOP_GRACE_S)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals, sig)
    _log.info("listening", url=f"http://{host}:{port}", pid=os.getpid(), policy=app[POLICY].current.source)
    try:
        await signals.requested.wait()
        await _drain(app, runner, site)
    finally:
        await runner.cleanup()
        signals.cancel()
    _log.info("stopped", pid=os.getpid())
