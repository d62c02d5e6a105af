"""One attempt on one deployment, bounded by its timeouts.

Every failure is turned into an :class:`~gateway.errors.UpstreamError` built from its row
of :mod:`gateway.dispatch.failures` (``connect``, ``first_token_timeout``, ``idle_timeout``
...), so the client, the log line, the retry policy and the metrics all see the same reason.
Everything that depends on the provider's dialect is asked of its
:class:`~gateway.providers.base.Provider`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.context import RequestContext
from gateway.dispatch.failures import failure, status_error
from gateway.dispatch.idle import AttemptWatch
from gateway.dispatch.policy import Timeouts
from gateway.errors import SwitchyardError, UpstreamError
from gateway.providers.base import CacheHints, Provider, Scanner
from gateway.providers.pool import UpstreamPool
from gateway.providers.transport import TransportResponse
from gateway.telemetry import tracing


@dataclass(slots=True)
class UnaryResult:
    """A whole (non-stream) answer, ready to forward."""

    body: bytes
    content_type: str
    obj: dict[str, Any] | None = None
    """``body`` parsed, when the provider parsed it (see :class:`~gateway.providers.base.Answer`)."""


class OpenStream:
    """A stream whose first event arrived; nothing has been sent to the client yet.

    ``first`` is the first complete event(s); :meth:`rest` yields the remaining bytes
    and raises a :class:`SwitchyardError` if the stream stalls, breaks or ends early.
    """

    __slots__ = (
        "_chunks",
        "_ctx",
        "_eof",
        "_pool",
        "_resp",
        "_timeouts",
        "_watch",
        "first",
        "on_error",
        "scanner",
        "upstream",
    )

    def __init__(
        self,
        ctx: RequestContext,
        pool: UpstreamPool,
        upstream: Provider,
        resp: TransportResponse,
        chunks: AsyncIterator[bytes],
        scanner: Scanner,
        first: bytes,
        timeouts: Timeouts,
        watch: AttemptWatch,
    ) -> None:
        self._ctx = ctx
        self._pool = pool
        self.upstream = upstream
        self._resp = resp
        self._chunks = chunks
        self._eof = False
        self.scanner = scanner
        self.first = first
        self._timeouts = timeouts
        self._watch = watch
        """The attempt's one timer, from its first token on (bounds each read by ``idle_s``)."""
        self.on_error: Callable[[SwitchyardError], None] | None = None
        """Called with the error that breaks the stream (dispatch counts it against the circuit)."""

    async def rest(self) -> AsyncIterator[bytes]:
        """The rest of the stream, as it arrives; raises when it stalls, breaks or ends early
        (after telling :attr:`on_error`). One generator, not one wrapping another: a layer
        costs each chunk of a token stream one more resumption."""
        ctx, scanner, idle_s = self._ctx, self.scanner, self._timeouts.idle_s
        if scanner.done:
            return
        name = self.upstream.name
        watch = self._watch
        watch.rebind()
        try:
            while True:
                watch.within(idle_s)
                try:
                    chunk = await anext(self._chunks)
                except StopAsyncIteration:
                    self._eof = True
                    break
                except asyncio.CancelledError:
                    if not watch.expired():
                        raise
                    if watch.at_total():
                        raise self._broken(_total_timeout(name, self._timeouts)) from None
                    message = (
                        f"deployment '{name}' sent nothing for idle_s={idle_s} in the middle of the stream"
                    )
                    raise self._broken(failure("idle_timeout", message)) from None
                except aiohttp.ClientError as exc:
                    message = f"deployment '{name}' broke the stream: {_describe(exc)}"
                    raise self._broken(failure("upstream_disconnected", message)) from None
                watch.idle()
                out = scanner.feed(chunk)
                if out:
                    ctx.last_chunk_at = time.perf_counter()
                    ctx.chunks = scanner.chunks
                    yield out
                if scanner.malformed is not None:
                    raise self._broken(malformed_error(name, scanner.malformed))
                if scanner.done:
                    # The end is [DONE] itself: the client's answer ends now, whether or not
                    # the upstream ends its body (close() deals with the connection).
                    return
        finally:
            watch.stop()
        message = f"deployment '{name}' ended the stream before it finished"
        raise self._broken(failure("stream_incomplete", message))

    def _broken(self, exc: SwitchyardError) -> SwitchyardError:
        """``exc`` ends the stream: told to :attr:`on_error` (dispatch counts it against the circuit)."""
        if self.on_error is not None:
            self.on_error(exc)
        return exc

    def close(self) -> None:
        """Return the connection if the stream was read to its end, else drop it. After
        ``[DONE]`` the upstream's end of body usually follows at once: it is awaited off
        the client's path, for at most :data:`DRAIN_AFTER_DONE_S`, so the connection can
        be reused (an upstream that keeps it open past that loses it): by the response
        itself when it can (:meth:`TransportResponse.release_at_end`), else by a task."""
        self._watch.stop()
        if self.scanner.done and (self._eof or self._resp.complete()):
            # The body's end came with [DONE] (the usual case): no drain task to start.
            self._resp.release()
        elif not self.scanner.done:
            self._resp.close()
        elif not self._resp.release_at_end(DRAIN_AFTER_DONE_S):
            # A response that cannot wait for its end by itself (aiohttp's client): a task
            # reads the body out. The built-in client needs no task, only a timer.
            task = asyncio.ensure_future(_drain(self._resp, self._chunks))
            _DRAINING.add(task)
            task.add_done_callback(_DRAINING.discard)
        self._pool.release(self.upstream)


DRAIN_AFTER_DONE_S = 0.5
"""How long a connection whose stream sent ``[DONE]`` may take to end its body."""

_DRAINING: set[asyncio.Future[None]] = set()


async def _drain(resp: TransportResponse, chunks: AsyncIterator[bytes]) -> None:
    """Wait for the end of a body whose answer is complete (bytes after ``[DONE]`` are
    ignored), then return the connection to the pool; drop it if the end does not come."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            async for _ in chunks:
                pass
    except asyncio.CancelledError:
        resp.close()
        raise
    except Exception:  # the end did not come in time, or the connection broke
        resp.close()
    else:
        resp.release()


def _headers(ctx: RequestContext) -> dict[str, str]:
    headers = {"x-request-id": ctx.request_id}
    if ctx.span is not None:
        tracing.inject(ctx, headers)
    return headers


def _hints(ctx: RequestContext) -> CacheHints | None:
    shape = ctx.shape
    if shape is None or not shape.prefix_hash:
        return None
    return CacheHints(
        shape.prefix_hash,
        shape.head_stable_chars,
        shape.head_stable_parts,
        ctx.snapshot.policy.shaping.prompt_cache_key,
    )


async def attempt_once(
    ctx: RequestContext,
    pool: UpstreamPool,
    name: str,
    timeouts: Timeouts,
    endpoint: str,
    body: dict[str, Any],
) -> UnaryResult:
    """One non-stream attempt on deployment ``name`` outside dispatch (no retry, no
    fallback), bounded by ``timeouts.total_s`` from now: the shadow sample's and the judge's call."""
    total_s = timeouts.total_s
    deadline = None if total_s is None else asyncio.get_running_loop().time() + total_s
    return await unary_attempt(ctx, pool, pool.acquire(name), timeouts, endpoint, body, deadline)


async def unary_attempt(
    ctx: RequestContext,
    pool: UpstreamPool,
    upstream: Provider,
    timeouts: Timeouts,
    endpoint: str,
    body: dict[str, Any],
    deadline: float | None = None,
) -> UnaryResult:
    """Send a non-stream request and read the whole answer (releases ``upstream`` to ``pool``).

    The first body byte must arrive within ``first_byte_s``, the rest without a gap of
    ``idle_s``, all of it by ``deadline`` (the request's ``total_s``). A 200 is checked by
    the provider (:meth:`Provider.read_answer`) before anything reaches the client: an
    empty, unparsable or error answer fails the attempt like a 5xx would.
    """
    prepared = upstream.prepare(body, stream=False, hints=_hints(ctx))
    name = upstream.name
    resp: TransportResponse | None = None
    parts: list[bytes] = []
    # One timer for every wait of the attempt (the first byte, then each read).
    watch = AttemptWatch(deadline)
    try:
        try:
            watch.within(timeouts.first_byte_s)
            resp = await upstream.send(
                endpoint, prepared.body, headers=_headers(ctx), connect_timeout_s=timeouts.connect_s
            )
            chunks = resp.iter_chunks()
            first = await anext(chunks, b"")
        except TimeoutError:  # the connection's own bound (connect_s), not the watch's
            raise _connect_timeout(name, timeouts) from None
        except asyncio.CancelledError:
            if not watch.expired():
                raise
            if watch.at_total():
                raise _total_timeout(name, timeouts) from None
            raise failure(
                "first_byte_timeout",
                f"deployment '{name}' sent no answer within first_byte_s={timeouts.first_byte_s}",
            ) from None
        if first:
            parts.append(first)
            # A small answer arrives whole with its headers: no read left to bound.
            if not resp.complete():
                await _read_rest(chunks, parts, name, timeouts, watch)
    except aiohttp.ClientError as exc:
        if resp is not None:
            resp.close()
        raise _client_error(name, exc) from None
    except BaseException:
        if resp is not None:
            resp.close()
        raise
    else:
        resp.release()
    finally:
        watch.stop()
        pool.release(upstream)
    data = b"".join(parts) if len(parts) != 1 else parts[0]
    if resp.status >= 300:  # a redirect is never an answer
        raise _status_error(upstream, resp.status, data, resp)
    content_type = resp.headers.get("Content-Type", "application/json")
    answer = upstream.read_answer(
        data, content_type, upstream.shown_model(ctx.requested_model), endpoint=endpoint
    )
    if answer.usage is not None:
        ctx.usage = answer.usage
    return UnaryResult(body=answer.body, content_type=content_type, obj=answer.obj)


async def _read_rest(
    chunks: AsyncIterator[bytes], parts: list[bytes], name: str, timeouts: Timeouts, watch: AttemptWatch
) -> None:
    """Read a non-stream body to its end, each read bounded by ``idle_s`` and the total deadline."""
    idle_s = timeouts.idle_s
    while True:
        watch.within(idle_s)
        try:
            chunk = await anext(chunks, None)
        except asyncio.CancelledError:
            if not watch.expired():
                raise
            if watch.at_total():
                raise _total_timeout(name, timeouts) from None
            raise failure(
                "body_timeout", f"deployment '{name}' stopped its answer for idle_s={idle_s}"
            ) from None
        watch.idle()
        if chunk is None:
            return
        parts.append(chunk)


async def stream_attempt(
    ctx: RequestContext,
    pool: UpstreamPool,
    upstream: Provider,
    timeouts: Timeouts,
    endpoint: str,
    body: dict[str, Any],
    deadline: float | None = None,
) -> OpenStream:
    """Send a stream request and wait for its first events (bounded by ``first_token_s``
    and ``deadline``, the request's ``total_s``).

    Nothing has reached the client yet, so a stream that ends before its first complete
    event (``empty_answer``), opens with an error event (``error_answer``) or a malformed
    one (``malformed_chunk``) fails the attempt and may be retried like a 5xx.

    On failure ``upstream`` is released to ``pool``; on success the returned stream
    releases it when closed.
    """
    prepared = upstream.prepare(body, stream=True, hints=_hints(ctx))
    scanner = upstream.scanner(
        strip_usage=prepared.strip_usage, shown_model=upstream.shown_model(ctx.requested_model)
    )
    name = upstream.name
    resp: TransportResponse | None = None
    # One timer for the whole attempt: the first token here, then each read of the stream
    # (the returned OpenStream keeps it).
    watch = AttemptWatch(deadline)
    try:
        watch.within(timeouts.first_token_s)
        try:
            resp = await upstream.send(
                endpoint, prepared.body, headers=_headers(ctx), connect_timeout_s=timeouts.connect_s
            )
            if resp.status >= 300:  # a redirect is never an answer
                data = await resp.read()
                raise _status_error(upstream, resp.status, data, resp)
            chunks = resp.iter_chunks()
            first = b""
            while not first and not scanner.done:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    cut = f" (a cut-off event: {scanner.pending[:80]!r})" if scanner.pending else ""
                    message = f"deployment '{name}' closed the stream before its first event{cut}"
                    raise failure("empty_answer", message) from None
                first = scanner.feed(chunk)
                if scanner.malformed is not None:
                    raise malformed_error(name, scanner.malformed)
                if scanner.error is not None:
                    raise error_event_failure(name, scanner.error)
            if scanner.done and first.lstrip().startswith(b"data: [DONE]"):
                raise failure("empty_answer", f"deployment '{name}' sent [DONE] and no answer event")
        except TimeoutError:  # the connection's own bound (connect_s), not the watch's
            raise _connect_timeout(name, timeouts) from None
        except asyncio.CancelledError:
            if not watch.expired():
                raise
            if watch.at_total():
                raise _total_timeout(name, timeouts) from None
            raise failure(
                "first_token_timeout",
                f"deployment '{name}' sent no first token within first_token_s={timeouts.first_token_s}",
            ) from None
        except aiohttp.ClientError as exc:
            raise _client_error(name, exc) from None
        watch.idle()
    except BaseException:
        watch.stop()
        if resp is not None:
            resp.close()
        pool.release(upstream)
        raise
    return OpenStream(ctx, pool, upstream, resp, chunks, scanner, first, timeouts, watch)


def _status_error(upstream: Provider, status: int, body: bytes, resp: TransportResponse) -> SwitchyardError:
    return status_error(upstream.name, status, body, resp.headers, reason=upstream.status_failure(status))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _connect_timeout(name: str, timeouts: Timeouts) -> UpstreamError:
    return failure(
        "connect_timeout", f"deployment '{name}' could not be reached within connect_s={timeouts.connect_s}"
    )


def _total_timeout(name: str, timeouts: Timeouts) -> UpstreamError:
    return failure(
        "total_timeout", f"deployment '{name}' did not finish the request within total_s={timeouts.total_s}"
    )


def error_event_failure(name: str, error: dict[str, Any]) -> UpstreamError:
    """The failure of a stream that opened with an error event (nothing reached the client)."""
    message = error.get("message")
    shown = message[:200] if isinstance(message, str) else "(no message)"
    code = error.get("code")
    return failure("error_answer", f"deployment '{name}' answered 200 with an error (code {code!r}): {shown}")


def malformed_error(name: str, event: bytes) -> UpstreamError:
    """The error that ends a stream whose provider sent an event that cannot be valid."""
    shown = event[:80].decode("utf-8", "replace")
    return failure("malformed_chunk", f"deployment '{name}' sent a malformed event: {shown!r}")


def _client_error(name: str, exc: aiohttp.ClientError) -> UpstreamError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return failure("connect", f"cannot connect to deployment '{name}': {_describe(exc)}")
    return failure("upstream_disconnected", f"deployment '{name}' failed: {_describe(exc)}")
