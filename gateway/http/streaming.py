"""Server-sent events passed through to the client as they arrive; a stream that fails after
it started ends with an SSE error event, never a silent cut."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.cache.service import AnswerStream
from gateway.context import RequestContext
from gateway.errors import SwitchyardError, sse_error_event
from gateway.http.redact import for_client
from gateway.http.responses import cancelled_by_drain, route_headers, shutdown_error

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _EventStream(web.StreamResponse):
    """An SSE answer whose headers leave in the same write as its first events (one send
    instead of two: the first events are in hand when it is prepared). The flag is
    aiohttp's own (``web.Response`` sets it); an aiohttp without it sends the headers first."""

    _send_headers_immediately = False


async def forward_stream(
    request: web.Request,
    ctx: RequestContext,
    opened: AnswerStream,
    error_event: Callable[[SwitchyardError], bytes] = sse_error_event,
    before_end: Callable[[], Awaitable[None]] | None = None,
    translate: Callable[[bytes], bytes] | None = None,
    finished: Callable[[], bool] | None = None,
) -> web.StreamResponse:
    """Write an opened upstream stream to the client, chunk by chunk, until its end.

    ``error_event`` is the endpoint's own error event; ``before_end`` runs before the last
    bytes go out (the Responses API stores its response there, so a client that sends the
    next turn at once finds it). An endpoint that speaks another dialect passes
    ``translate`` (upstream bytes -> the events it sends) and ``finished`` (its end was
    sent); by default the bytes pass as they are and the end is the upstream's."""
    resp = _EventStream(headers={**route_headers(ctx), **_SSE_HEADERS})
    if finished is None:
        finished = lambda: opened.scanner.done  # noqa: E731
    # Everything up to the end is written as it arrives; the last bytes go out together
    # with the end of the response (one write instead of two).
    tail = b""
    try:
        await resp.prepare(request)
        headers_sent = False
        # The first events (in hand), then the rest as it arrives: read straight from the
        # stream's own generator, not through another one (a resumption per chunk).
        rest = opened.rest()
        chunk: bytes | None = opened.first
        while chunk is not None:
            out = translate(chunk) if translate is not None else chunk
            if finished():
                tail += out
            elif out or not headers_sent:
                # The first write carries the headers, even when it has no events of its own.
                await resp.write(out)
                headers_sent = True
            chunk = await anext(rest, None)
    except SwitchyardError as exc:
        # Headers are gone; end the stream with an error event, never a silent cut.
        tail += error_event(for_client(request.app, ctx, exc))
    except ConnectionError:
        ctx.status = 499
        ctx.error_code = "client_disconnected"
    except asyncio.CancelledError:
        if not cancelled_by_drain(request.app):
            raise
        # Cancelled by the drain deadline with the stream still running: end it with an
        # error event the SDKs raise on, rather than cutting it silently.
        err = shutdown_error()
        ctx.error_code = err.code
        tail += error_event(err)
    finally:
        opened.close()
        ctx.usage = opened.scanner.usage
        if opened.scanner.error is not None and ctx.error_code is None:
            ctx.error_code = str(opened.scanner.error.get("code") or "upstream_stream_error")
    if ctx.status != 499:
        if before_end is not None:
            await before_end()
        with contextlib.suppress(ConnectionError):
            await resp.write_eof(tail)
    return resp
