"""One attempt on one deployment, bounded by its timeouts.

Every failure is turned into a :class:`~gateway.errors.SwitchyardError` whose ``code``
says what went wrong (``connect_failed``, ``first_token_timeout``, ``idle_timeout`` ...),
so the client, the log line, the retry policy and the metrics all see the same reason.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.context import RequestContext
from gateway.dispatch.policy import Timeouts
from gateway.errors import (
    RateLimitError,
    SwitchyardError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.policy import Deployment
from gateway.telemetry import tracing
from gateway.upstream import Upstream, UpstreamPool, UpstreamResponse
from gateway.upstream.sse import StreamScanner


@dataclass(slots=True)
class UnaryResult:
    """A whole (non-stream) answer, ready to forward."""

    body: bytes
    content_type: str


class OpenStream:
    """A stream whose first event arrived; nothing has been sent to the client yet.

    ``first`` is the first complete event(s); :meth:`rest` yields the remaining bytes
    and raises a :class:`SwitchyardError` if the stream stalls, breaks or ends early.
    """

    __slots__ = (
        "_chunks",
        "_ctx",
        "_pool",
        "_resp",
        "_timeouts",
        "_total_deadline",
        "first",
        "on_error",
        "scanner",
        "upstream",
    )

    def __init__(
        self,
        ctx: RequestContext,
        pool: UpstreamPool,
        upstream: Upstream,
        resp: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        scanner: StreamScanner,
        first: bytes,
        timeouts: Timeouts,
        total_deadline: float | None,
    ) -> None:
        self._ctx = ctx
        self._pool = pool
        self.upstream = upstream
        self._resp = resp
        self._chunks = chunks
        self.scanner = scanner
        self.first = first
        self._timeouts = timeouts
        self._total_deadline = total_deadline
        self.on_error: Callable[[SwitchyardError], None] | None = None
        """Called with the error that breaks the stream (dispatch counts it against the circuit)."""

    async def rest(self) -> AsyncIterator[bytes]:
        try:
            async for out in self._rest():
                yield out
        except SwitchyardError as exc:
            if self.on_error is not None:
                self.on_error(exc)
            raise

    async def _rest(self) -> AsyncIterator[bytes]:
        ctx, scanner, idle_s = self._ctx, self.scanner, self._timeouts.idle_s
        loop = asyncio.get_running_loop()
        name = self.upstream.name
        while True:
            deadline = _earliest(self._total_deadline, loop.time() + idle_s if idle_s else None)
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(self._chunks)
            except StopAsyncIteration:
                break
            except TimeoutError:
                if self._total_deadline is not None and loop.time() >= self._total_deadline:
                    raise UpstreamTimeoutError(
                        f"deployment '{name}' did not finish within total_s={self._timeouts.total_s}",
                        code="total_timeout",
                    ) from None
                raise UpstreamTimeoutError(
                    f"deployment '{name}' sent nothing for idle_s={idle_s} in the middle of the stream",
                    code="idle_timeout",
                ) from None
            except aiohttp.ClientError as exc:
                raise UpstreamError(
                    f"deployment '{name}' broke the stream: {_describe(exc)}", code="upstream_disconnected"
                ) from None
            out = scanner.feed(chunk)
            if out:
                ctx.last_chunk_at = time.perf_counter()
                ctx.chunks = scanner.chunks
                yield out
            if scanner.malformed is not None:
                raise malformed_error(name, scanner.malformed)
        if not scanner.done:
            raise UpstreamError(
                f"deployment '{name}' ended the stream before it finished", code="stream_incomplete"
            )

    def close(self) -> None:
        """Return the connection if the stream was read to its end, else drop it."""
        if self.scanner.done and not self.scanner.pending:
            self._resp.release()
        else:
            self._resp.close()
        self._pool.release(self.upstream)


def _headers(ctx: RequestContext) -> dict[str, str]:
    headers = {"x-request-id": ctx.request_id}
    if ctx.span is not None:
        tracing.inject(ctx, headers)
    return headers


_EPHEMERAL = {"type": "ephemeral"}


def with_hints(ctx: RequestContext, upstream: Upstream, body: dict[str, Any]) -> dict[str, Any]:
    """Provider cache hints for this deployment: OpenAI's ``prompt_cache_key`` (the stable
    prefix's hash, when the client set none), or a ``cache_control`` breakpoint at the end of
    the stable prefix for a deployment with ``cache_breakpoints``."""
    shape = ctx.shape
    if shape is None or not shape.prefix_hash:
        return body
    deployment = upstream.deployment
    if (
        deployment.provider == "openai"
        and ctx.snapshot.policy.shaping.prompt_cache_key
        and "prompt_cache_key" not in body
    ):
        body = {**body, "prompt_cache_key": shape.prefix_hash}
    messages = body.get("messages")
    if not deployment.cache_breakpoints or not isinstance(messages, list) or not messages:
        return body
    head = messages[0]
    content = head.get("content") if isinstance(head, dict) else None
    parts: list[Any] | None = None
    if isinstance(content, str) and shape.head_stable_chars:
        cut = shape.head_stable_chars
        parts = [{"type": "text", "text": content[:cut], "cache_control": _EPHEMERAL}]
        if content[cut:]:
            parts.append({"type": "text", "text": content[cut:]})
    elif (
        isinstance(content, list)
        and shape.head_stable_parts
        and isinstance(content[shape.head_stable_parts - 1], dict)
    ):
        parts = list(content)
        last = shape.head_stable_parts - 1
        parts[last] = {**parts[last], "cache_control": _EPHEMERAL}
    if parts is not None:
        body = {**body, "messages": [{**head, "content": parts}, *messages[1:]]}
    return body


async def unary_attempt(
    ctx: RequestContext,
    pool: UpstreamPool,
    upstream: Upstream,
    timeouts: Timeouts,
    endpoint: str,
    body: dict[str, Any],
) -> UnaryResult:
    """Send a non-stream request and read the whole answer (releases ``upstream`` to ``pool``)."""
    body = with_hints(ctx, upstream, body)
    try:
        async with asyncio.timeout(timeouts.total_s) as scope:
            try:
                resp = await upstream.send(
                    endpoint, body, headers=_headers(ctx), connect_timeout_s=timeouts.connect_s
                )
                try:
                    data = await resp.read()
                except BaseException:
                    resp.close()
                    raise
                resp.release()
            except TimeoutError:
                if scope.expired():
                    raise
                raise _connect_timeout(upstream.name, timeouts) from None
            except aiohttp.ClientError as exc:
                raise _client_error(upstream.name, exc) from None
    except TimeoutError:
        raise UpstreamTimeoutError(
            f"deployment '{upstream.name}' did not answer within total_s={timeouts.total_s}",
            code="total_timeout",
        ) from None
    finally:
        pool.release(upstream)
    if resp.status >= 400:
        raise status_error(upstream.name, resp.status, data, resp.headers)
    content_type = resp.headers.get("Content-Type", "application/json")
    if content_type.startswith("application/json"):
        data = _read_usage_and_rewrite(ctx, upstream, data)
    return UnaryResult(body=data, content_type=content_type)


async def stream_attempt(
    ctx: RequestContext,
    pool: UpstreamPool,
    upstream: Upstream,
    timeouts: Timeouts,
    endpoint: str,
    body: dict[str, Any],
) -> OpenStream:
    """Send a stream request and wait for its first event (bounded by ``first_token_s``).

    On failure ``upstream`` is released to ``pool``; on success the returned stream
    releases it when closed.
    """
    deployment = upstream.deployment
    body = with_hints(ctx, upstream, body)
    strip_usage = False
    if deployment.stream_usage and not _wants_usage(body):
        body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        strip_usage = True
    scanner = StreamScanner(
        strip_usage=strip_usage,
        model_from=upstream.upstream_model if deployment.response_model != "upstream" else None,
        model_to=_shown_model(ctx, deployment, upstream.name),
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    total_deadline = start + timeouts.total_s if timeouts.total_s else None
    first_deadline = _earliest(
        total_deadline, start + timeouts.first_token_s if timeouts.first_token_s else None
    )
    resp: UpstreamResponse | None = None
    try:
        async with asyncio.timeout_at(first_deadline) as scope:
            try:
                resp = await upstream.send(
                    endpoint, body, headers=_headers(ctx), connect_timeout_s=timeouts.connect_s
                )
                if resp.status >= 400:
                    data = await resp.read()
                    raise status_error(upstream.name, resp.status, data, resp.headers)
                chunks = resp.iter_chunks()
                first = b""
                while not first:
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        raise UpstreamError(
                            f"deployment '{upstream.name}' closed the stream before its first event",
                            code="stream_incomplete",
                        ) from None
                    first = scanner.feed(chunk)
                    if scanner.malformed is not None:
                        raise malformed_error(upstream.name, scanner.malformed)
            except TimeoutError:
                if scope.expired():
                    raise
                raise _connect_timeout(upstream.name, timeouts) from None
            except aiohttp.ClientError as exc:
                raise _client_error(upstream.name, exc) from None
    except BaseException as exc:
        if resp is not None:
            resp.close()
        pool.release(upstream)
        if isinstance(exc, TimeoutError):
            which = "total_s" if first_deadline == total_deadline else "first_token_s"
            limit = timeouts.total_s if which == "total_s" else timeouts.first_token_s
            raise UpstreamTimeoutError(
                f"deployment '{upstream.name}' sent no first token within {which}={limit}",
                code="first_token_timeout" if which == "first_token_s" else "total_timeout",
            ) from None
        raise
    return OpenStream(ctx, pool, upstream, resp, chunks, scanner, first, timeouts, total_deadline)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _shown_model(ctx: RequestContext, deployment: Deployment, name: str) -> str | None:
    if deployment.response_model == "deployment":
        return name
    if deployment.response_model == "requested":
        return ctx.requested_model
    return None


def _read_usage_and_rewrite(ctx: RequestContext, upstream: Upstream, data: bytes) -> bytes:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    if not isinstance(obj, dict):
        return data
    usage = obj.get("usage")
    if isinstance(usage, dict):
        ctx.usage = usage
    shown = _shown_model(ctx, upstream.deployment, upstream.name)
    if shown is not None and "model" in obj:
        obj["model"] = shown
        return orjson.dumps(obj)
    return data


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _connect_timeout(name: str, timeouts: Timeouts) -> UpstreamTimeoutError:
    return UpstreamTimeoutError(
        f"deployment '{name}' could not be reached within connect_s={timeouts.connect_s}",
        code="connect_timeout",
    )


def malformed_error(name: str, event: bytes) -> UpstreamError:
    shown = event[:80].decode("utf-8", "replace")
    return UpstreamError(f"deployment '{name}' sent a malformed event: {shown!r}", code="malformed_chunk")


def _client_error(name: str, exc: aiohttp.ClientError) -> SwitchyardError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError(
            f"cannot connect to deployment '{name}': {_describe(exc)}", code="connect_failed"
        )
    return UpstreamError(f"deployment '{name}' failed: {_describe(exc)}", code="upstream_disconnected")


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``Retry-After`` (delta-seconds or HTTP date) or ``retry-after-ms`` header."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def status_error(name: str, status: int, body: bytes, headers: Mapping[str, str]) -> SwitchyardError:
    """Map an upstream's error status to what the client should see.

    The client's own mistakes (400, 413, 422 ...) are relayed as the upstream said them;
    the gateway's configuration faults (401/403/404 from the upstream) and upstream
    failures become 502/503/504, so a client never blames its own key for ours.
    """
    error = _status_error(name, status, body, headers)
    error.upstream_status = status
    return error


def _status_error(name: str, status: int, body: bytes, headers: Mapping[str, str]) -> SwitchyardError:
    relayed = UpstreamStatusError(status, body)
    detail = relayed.message
    if status == 429:
        return RateLimitError(
            f"deployment '{name}' is rate limited: {detail}",
            retry_after_s=retry_after_s(headers),
            code=relayed.code or "rate_limit_exceeded",
        )
    if status in (401, 403):
        # The upstream's own text is left out: providers echo part of the key they were sent.
        return UpstreamError(
            f"deployment '{name}' rejected the gateway's credentials (HTTP {status}); "
            "check the key its api_key_env names",
            code="upstream_auth_failed",
        )
    if status == 404:
        return UpstreamError(
            f"deployment '{name}' does not serve its model (HTTP 404): {detail}", code="upstream_not_found"
        )
    if status in (408, 504):
        return UpstreamTimeoutError(f"deployment '{name}' timed out (HTTP {status}): {detail}")
    if status == 503:
        return UpstreamUnavailableError(f"deployment '{name}' is unavailable (HTTP 503): {detail}")
    if status >= 500:
        return UpstreamError(f"deployment '{name}' failed (HTTP {status}): {detail}")
    return relayed
