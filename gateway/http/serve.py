"""Serving the app: aiohttp's connection handler answering in OpenAI's error JSON, and the
drain on SIGINT/SIGTERM (stop accepting, let what is in flight finish, cancel the rest)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.http.header_deadline import HeaderDeadlineHandler
from gateway.http.state import DRAINING, IN_FLIGHT, POLICY, SETTINGS

_log = structlog.get_logger("switchyard")


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


async def serve(app: web.Application, host: str, port: int, *, reuse_port: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let the requests and streams in
    flight finish for up to ``drain_timeout_s``, cancel what is left, and close."""
    runner = _Runner(
        app,
        handler_cancellation=True,
        access_log=None,
        # _drain has waited already; what is left gets this much more before it is cut.
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port, backlog=1024)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _log.info("listening", url=f"http://{host}:{port}", pid=os.getpid(), policy=app[POLICY].current.source)
    try:
        await stop.wait()
        await _drain(app, runner, site)
    finally:
        await runner.cleanup()
    _log.info("stopped", pid=os.getpid())
