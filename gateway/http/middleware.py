"""The main app's middleware: a context and an id for every request, the browser checks
(a foreign ``Origin`` where no key guards, a JSON ``Content-Type``: :mod:`gateway.http.browser`),
the virtual-key check on ``/v1``, the request body read within its deadline (and in an
encoding the gateway can decode), every failure turned into OpenAI's error JSON, and the
finished request handed to the pipeline's sinks."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.web_protocol import RequestPayloadError

from gateway.auth.bearer import bearer_token
from gateway.context import RequestContext
from gateway.dashboard import key_label
from gateway.errors import (
    AuthenticationError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    RequestTooLargeError,
    SwitchyardError,
)
from gateway.http import browser
from gateway.http.redact import for_client
from gateway.http.responses import cancelled_by_drain, error_response, shutdown_error
from gateway.http.state import AUTH_MODE, CTX, IN_FLIGHT, KEYS, POLICY, SETTINGS, STAGES, TRACING
from gateway.pipeline import finish
from gateway.telemetry import tracing

_log = structlog.get_logger("switchyard.request")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What aiohttp decodes itself (brotli and zstd only with their optional packages installed).
_ENCODINGS = frozenset(
    {"", "identity", "gzip", "deflate", *(["br"] if HAS_BROTLI else []), *(["zstd"] if HAS_ZSTD else [])}
)


def _request_id(request: web.Request) -> str:
    given = request.headers.get("x-request-id")
    if given and _REQUEST_ID.match(given):
        return given
    # Ids need to be unique, not secret: the Mersenne Twister is ten times cheaper than urandom.
    return f"req_{random.getrandbits(96):024x}"


def _http_error(exc: web.HTTPException, request: web.Request) -> SwitchyardError:
    if exc.status == 404:
        return NotFoundError(f"Unknown path: {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowedError(f"Method {request.method} is not allowed on {request.path}")
    if exc.status == 413:
        limit = request.app[SETTINGS].max_body_bytes
        return RequestTooLargeError(f"Request body is larger than the limit of {limit} bytes.")
    return InvalidRequestError(exc.reason or f"HTTP {exc.status}")


def _client_error(status: int, message: str, code: str) -> SwitchyardError:
    # 408 and 415 are rare enough not to need classes of their own: the SDKs key on the status.
    err = InvalidRequestError(message, code=code)
    err.status = status
    return err


async def _read_body(request: web.Request, timeout_s: float) -> None:
    """Read the whole body now, within ``timeout_s`` (a client sending it slowly holds a
    connection and a task: 408 past the deadline); handlers then get it from memory."""
    if not request.body_exists:
        return
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in _ENCODINGS:
        raise _client_error(
            415,
            f"Content-Encoding {encoding[:40]!r} is not supported: send the body uncompressed "
            f"or as {', '.join(sorted(e for e in _ENCODINGS if e and e != 'identity'))}.",
            "unsupported_content_encoding",
        )
    try:
        if request.content.is_eof():
            # The whole body came with the headers (most requests): nothing to wait for,
            # so no timer to arm and cancel.
            await request.read()
            return
        async with asyncio.timeout(timeout_s):
            await request.read()
    except TimeoutError:
        raise _client_error(
            408, f"The request body was not received within {timeout_s:g} s.", "request_timeout"
        ) from None
    except RequestPayloadError:
        pass  # a body that does not decode: the handler's read names the encoding


async def _answer_and_close(request: web.Request, resp: web.StreamResponse) -> None:
    """Send ``resp`` now and close the connection: aiohttp would otherwise linger up to 10 s
    reading the rest of a body that is not coming."""
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    request.protocol.force_close()  # closing the transport sends what was written first


async def _authenticate(request: web.Request, ctx: RequestContext) -> None:
    # Anthropic's SDKs send the key as x-api-key.
    token = bearer_token(request.headers.get("Authorization")) or request.headers.get("x-api-key")
    if token is None:
        raise AuthenticationError(
            "You didn't provide an API key. Send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') "
            "with a key from `switchyard keys create`."
        )
    key = await request.app[KEYS].verify(token)
    ctx.key = key
    ctx.key_id = key.key_id


@web.middleware
async def context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request a context and an id; turn every failure into OpenAI's error JSON;
    hand each finished API request to the pipeline's sinks (the log line, metrics, stats)."""
    app = request.app
    if request.method == "OPTIONS":
        answer = browser.preflight(request, app[SETTINGS])
        if answer is not None:
            return answer
    ctx = RequestContext(
        request_id=_request_id(request),
        endpoint=request.path,
        snapshot=app[POLICY].current,
    )
    request[CTX] = ctx
    api = ctx.endpoint.startswith("/v1/")
    token = None
    if api:
        tracer = app[TRACING]
        if tracer is not None:
            token = tracer.start_request(ctx, request.method, request.headers)
    task = asyncio.current_task()
    in_flight = app[IN_FLIGHT]
    if task is not None:
        in_flight.add(task)
    try:
        settings = app[SETTINGS]
        cors = browser.screen_origin(request, settings, browser.unguarded(request, app[AUTH_MODE], settings))
        # On every answer of this request, a stream's and an error's included.
        ctx.response_headers.update(cors)
        if api and app[AUTH_MODE] == "keys":
            await _authenticate(request, ctx)
        elif api:
            # No virtual keys: the per-key views name a client by a short hash of its token.
            api_key = request.headers.get("x-api-key")
            ctx.key_id = key_label(request.headers.get("Authorization") or (api_key and f"Bearer {api_key}"))
        if request.match_info.http_exception is None:
            browser.check_content_type(request)
        await _read_body(request, settings.request_body_timeout_s)
        resp = await handler(request)
        if cors and not resp.prepared:
            resp.headers.update(cors)
    except SwitchyardError as exc:
        resp = error_response(for_client(app, ctx, exc), ctx)
        if exc.status == 408:
            await _answer_and_close(request, resp)
    except web.HTTPException as exc:
        err = _http_error(exc, request)
        ctx.error_code = err.code
        resp = error_response(err, ctx)
    except asyncio.CancelledError:
        if cancelled_by_drain(app):
            # Cancelled by the drain deadline (not by a client that went away): answer.
            err = shutdown_error()
            ctx.error_code = err.code
            resp = error_response(err, ctx)
        else:
            # The client went away; 499 as nginx logs it.
            ctx.status = 499
            if token is not None:
                tracing.end_request(ctx, token)
            if api:
                finish(app[STAGES], ctx)
            raise
    except Exception:
        _log.exception("unhandled_error", request_id=ctx.request_id, path=request.path)
        err = SwitchyardError(f"Internal error in the gateway (request id {ctx.request_id}).")
        ctx.error_code = "internal_error"
        resp = error_response(err, ctx)
    finally:
        in_flight.discard(task)
    if not ctx.status:
        ctx.status = resp.status
    if token is not None:
        tracing.end_request(ctx, token)
    if api:
        ctx.finished_at = time.perf_counter()
        # After this step aiohttp writes the response; the bookkeeping waits for the
        # next loop turn so it is not on the client's latency path.
        asyncio.get_running_loop().call_soon(finish, app[STAGES], ctx)
    return resp
