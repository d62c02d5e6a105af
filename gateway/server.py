"""The aiohttp application: routes, middleware, and the wiring of the stages.

This is the only module that knows about every stage. A request runs
parse -> route -> dispatch -> forward, each a plain call on one RequestContext;
the log line and the stats are written when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway import cachestats
from gateway._model import parse_duration
from gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    check_limits,
    validate,
)
from gateway.auth.keys import KeyStore, bearer_token, validate_new_key
from gateway.auth.limits import Limiter
from gateway.cachestats import Accounting
from gateway.cachestats.cost import cost_nano_usd
from gateway.config import PolicyHolder, PolicySnapshot, Settings, is_loopback
from gateway.context import RequestContext
from gateway.dashboard import PAGE as DASHBOARD_PAGE
from gateway.dashboard import DashboardStats, key_label
from gateway.dispatch.dispatcher import Dispatcher, OpenStream, UnaryResult
from gateway.dispatch.fanout import parse_fanout, run_fanout, timeout_override
from gateway.errors import (
    AuthenticationError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotFoundError,
    PermissionDeniedError,
    RequestTooLargeError,
    SwitchyardError,
    UpstreamUnavailableError,
    sse_error_event,
)
from gateway.providers.pool import UpstreamPool
from gateway.replicas.status import SUPERVISOR, readiness, replica_status
from gateway.routing.escalation import escalation_reason
from gateway.routing.resolve import Route, model_names, router_for, tier_route
from gateway.shaping.service import Shaping, pop_gateway_metadata
from gateway.store import connect
from gateway.store.writer import StatsWriter
from gateway.telemetry import logging as tlog
from gateway.telemetry import tracing
from gateway.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.telemetry.metrics import Metrics

_log = structlog.get_logger("switchyard.request")
_log_main = structlog.get_logger("switchyard")

SETTINGS = web.AppKey("settings", Settings)
POLICY = web.AppKey("policy", PolicyHolder)
POOL = web.AppKey("pool", UpstreamPool)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
REDIS = web.AppKey("redis", Redis)
STATS = web.AppKey("stats", StatsWriter)
ACCOUNTING = web.AppKey("accounting", Accounting)
SHAPING = web.AppKey("shaping", Shaping)
METRICS = web.AppKey("metrics", Metrics)
DASHBOARD = web.AppKey("dashboard", DashboardStats)
DASHBOARD_HTML = web.AppKey("dashboard_html", bytes)
TRACING: web.AppKey[tracing.Tracing | None] = web.AppKey("tracing")
KEYS = web.AppKey("keys", KeyStore)
LIMITER = web.AppKey("limiter", Limiter)
AUTH_MODE = web.AppKey("auth_mode", str)
SECRETS = web.AppKey("secrets", dict[int, tuple[str, ...]])
DRAINING = web.AppKey("draining", asyncio.Event)
IN_FLIGHT = web.AppKey("in_flight", set[asyncio.Task[Any]])
CTX = web.RequestKey("ctx", RequestContext)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _request_id(request: web.Request) -> str:
    given = request.headers.get("x-request-id")
    if given and _REQUEST_ID.match(given):
        return given
    # Ids need to be unique, not secret: the Mersenne Twister is ten times cheaper than urandom.
    return f"req_{random.getrandbits(96):024x}"


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def error_response(exc: SwitchyardError, ctx: RequestContext | None = None) -> web.Response:
    # The gateway has already retried what was worth retrying: the SDKs must not add a
    # second layer of retries on top (the official openai SDK obeys this header).
    headers = {**exc.headers, "x-should-retry": "false"}
    if ctx is not None:
        headers.update(_route_headers(ctx))
    return web.Response(
        body=exc.to_json(), status=exc.status, headers=headers, content_type="application/json"
    )


def _route_headers(ctx: RequestContext) -> dict[str, str]:
    headers = {"x-request-id": ctx.request_id}
    if ctx.deployment is not None:
        headers["x-switchyard-model"] = ctx.deployment
        headers["x-switchyard-attempts"] = str(ctx.attempts)
    if ctx.route_reason is not None:
        headers["x-switchyard-route"] = ctx.route_reason
    if ctx.fallback_tier is not None:
        headers["x-switchyard-fallback"] = ctx.fallback_tier
    if ctx.hedged:
        headers["x-switchyard-hedged"] = "true"
    if ctx.escalated is not None:
        headers["x-switchyard-escalated"] = ctx.escalated
    if ctx.shape is not None:
        headers["x-switchyard-shaping"] = ctx.shape.header()
    if ctx.prefix_hit_tokens is not None:
        headers["x-switchyard-prefix-hit"] = str(ctx.prefix_hit_tokens)
    if ctx.span is not None:
        parent = tracing.traceparent(ctx)
        if parent is not None:
            headers["traceparent"] = parent
    if ctx.response_headers:
        headers.update(ctx.response_headers)
    return headers


def _http_error(exc: web.HTTPException, request: web.Request) -> SwitchyardError:
    if exc.status == 404:
        return NotFoundError(f"Unknown path: {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowedError(f"Method {request.method} is not allowed on {request.path}")
    if exc.status == 413:
        limit = request.app[SETTINGS].max_body_bytes
        return RequestTooLargeError(f"Request body is larger than the limit of {limit} bytes.")
    return InvalidRequestError(exc.reason or f"HTTP {exc.status}")


@web.middleware
async def context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request a context and an id; turn every failure into OpenAI's error JSON;
    write the one log line per API request."""
    ctx = RequestContext(
        request_id=_request_id(request),
        endpoint=request.path,
        snapshot=request.app[POLICY].current,
    )
    request[CTX] = ctx
    api = ctx.endpoint.startswith("/v1/")
    token = None
    if api:
        tracer = request.app[TRACING]
        if tracer is not None:
            token = tracer.start_request(ctx, request.method, request.headers)
    task = asyncio.current_task()
    in_flight = request.app[IN_FLIGHT]
    if task is not None:
        in_flight.add(task)
    try:
        if api and request.app[AUTH_MODE] == "keys":
            await _authenticate(request, ctx)
        elif api:
            # No virtual keys: the per-key views name a client by a short hash of its token.
            ctx.key_id = key_label(request.headers.get("Authorization"))
        resp = await handler(request)
    except SwitchyardError as exc:
        ctx.error_code = exc.code
        exc.message = _scrub(request.app, ctx.snapshot, exc.message)
        resp = error_response(exc, ctx)
    except web.HTTPException as exc:
        err = _http_error(exc, request)
        ctx.error_code = err.code
        resp = error_response(err, ctx)
    except asyncio.CancelledError:
        if request.app[DRAINING].is_set() and task is not None and task.uncancel() == 0:
            # Cancelled by the drain deadline (not by a client that went away): answer.
            err = _shutdown_error()
            ctx.error_code = err.code
            resp = error_response(err, ctx)
        else:
            # The client went away; 499 as nginx logs it.
            ctx.status = 499
            if token is not None:
                tracing.end_request(ctx, token)
            if api:
                _finish(request.app, ctx)
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
        asyncio.get_running_loop().call_soon(_finish, request.app, ctx)
    return resp


async def _authenticate(request: web.Request, ctx: RequestContext) -> None:
    token = bearer_token(request.headers.get("Authorization"))
    if token is None:
        raise AuthenticationError(
            "You didn't provide an API key. Send 'Authorization: Bearer <key>' with a key from "
            "`switchyard keys create`."
        )
    key = await request.app[KEYS].verify(token)
    ctx.key = key
    ctx.key_id = key.key_id


async def _admit(request: web.Request, ctx: RequestContext) -> None:
    """Take this request from its key's rate limits and budget (429 when over)."""
    key = ctx.key
    if key is None or not key.limited:
        return
    admission = await request.app[LIMITER].admit(key)
    ctx.response_headers.update(admission.headers)


def _secrets(app: web.Application, snapshot: PolicySnapshot) -> tuple[str, ...]:
    """The secret values this gateway holds: the admin key, every upstream key its policy
    names, every header value it sends upstream (longer than 5 characters)."""
    cache = app[SECRETS]
    found = cache.get(snapshot.version)
    if found is None:
        values = {app[SETTINGS].admin_key or ""}
        for deployment in snapshot.policy.deployments.values():
            if deployment.api_key_env:
                values.add(os.environ.get(deployment.api_key_env, ""))
            values.update(deployment.headers.values())
        found = tuple(v for v in values if len(v) > 5)
        cache.clear()
        cache[snapshot.version] = found
    return found


def _scrub(app: web.Application, snapshot: PolicySnapshot, text: str) -> str:
    """``text`` with any secret the gateway holds replaced: an error message that quotes an
    upstream's answer must never hand a client our keys."""
    for secret in _secrets(app, snapshot):
        if secret in text:
            text = text.replace(secret, "<redacted>")
    return text


def _redacted_policy(snapshot: PolicySnapshot) -> dict[str, Any]:
    """The policy as ``/admin/policy`` shows it: header values (which may hold keys
    interpolated from the environment) and credentials in URLs replaced."""
    dumped: dict[str, Any] = snapshot.policy.model_dump(mode="json")
    for deployment in dumped["deployments"].values():
        deployment["headers"] = dict.fromkeys(deployment.get("headers") or {}, "<redacted>")
        url = deployment.get("base_url")
        if isinstance(url, str) and "@" in url.split("/", 3)[2]:
            scheme, rest = url.split("://", 1)
            deployment["base_url"] = f"{scheme}://<redacted>@{rest.split('@', 1)[1]}"
    return dumped


def _shutdown_error() -> SwitchyardError:
    return UpstreamUnavailableError(
        "The gateway is shutting down and its drain deadline passed; retry the request.",
        code="gateway_shutdown",
    )


def _finish(app: web.Application, ctx: RequestContext) -> None:
    if ctx.finished_at is None:
        ctx.finished_at = time.perf_counter()
    if ctx.deployment is not None:
        found = ctx.snapshot.policy.deployments.get(ctx.deployment)
        ctx.cost_nano_usd = cost_nano_usd(found.price if found is not None else None, ctx.usage)
        app[ACCOUNTING].record(ctx)
        app[DASHBOARD].record(ctx)
    app[METRICS].record(ctx)
    if ctx.key is not None:
        # Tokens for the key's TPM bucket, cost for its lifetime spend (and budget).
        tokens = (ctx.usage_int("prompt_tokens") or 0) + (ctx.usage_int("completion_tokens") or 0)
        app[LIMITER].charge(ctx.key, tokens if ctx.key.tpm else 0, ctx.cost_nano_usd)
    ttft = ctx.ttft_ms
    tlog.request_line(
        request_id=ctx.request_id,
        key_id=ctx.key_id,
        endpoint=ctx.endpoint,
        model=ctx.requested_model,
        tier=ctx.tier,
        deployment=ctx.deployment,
        stream=ctx.stream,
        status=ctx.status,
        error_code=ctx.error_code,
        attempts=ctx.attempts,
        ttft_ms=round(ttft, 2) if ttft is not None else None,
        total_ms=round(ctx.total_ms, 2),
        prompt_tokens=ctx.usage_int("prompt_tokens"),
        completion_tokens=ctx.usage_int("completion_tokens"),
        cached_tokens=ctx.cached_tokens,
        cost_usd=ctx.cost_nano_usd / 1e9 if ctx.cost_nano_usd else None,
    )


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        raw = await request.read()
    except RequestPayloadError:
        encoding = request.headers.get("Content-Encoding", "")
        raise InvalidRequestError(
            f"The request body could not be read (Content-Encoding {encoding!r} does not match it).",
            code="invalid_body",
        ) from None
    try:
        body = orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError):
        raise InvalidRequestError(
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    return body


def _checked(request: web.Request, schema: type[BaseModel], body: dict[str, Any]) -> None:
    settings = request.app[SETTINGS]
    check_limits(
        body,
        max_depth=settings.max_json_depth,
        max_messages=settings.max_messages,
        max_content_parts=settings.max_content_parts,
    )
    validate(schema, body)


def _prepare(
    request: web.Request, ctx: RequestContext, schema: type[BaseModel], body: dict[str, Any]
) -> Route:
    """Validate, shape (chat) and route a request body. The gateway-only hints (tier,
    template) come from headers or ``metadata`` and are not sent upstream."""
    _checked(request, schema, body)
    ctx.requested_model = body["model"]
    hints = pop_gateway_metadata(body)
    headers = request.headers
    if ctx.span is not None:
        tracing.request_attributes(ctx, body)
    if schema is ChatCompletionRequest:
        template = headers.get("x-switchyard-template") or hints.get("switchyard_template")
        with tracing.child(ctx, "shape") as span:
            request.app[SHAPING].shape(ctx, body, request.app[STATS], template)
            if span is not None and ctx.shape is not None:
                span.set_attributes(
                    {
                        "switchyard.template": ctx.shape.template,
                        "switchyard.moved_segments": ctx.shape.moved,
                        "switchyard.stable_prefix_tokens": ctx.shape.stable_prefix_tokens,
                    }
                )
    dispatcher = request.app[DISPATCHER]
    hint = headers.get("x-switchyard-tier") or hints.get("switchyard_tier")
    with tracing.child(ctx, "route") as span:
        route = router_for(ctx.snapshot.policy).resolve(
            body, hint, dispatcher.available, dispatcher.pool.in_flight
        )
        _set_route(ctx, route)
        if span is not None:
            span.set_attributes(
                {
                    "switchyard.tier": route.tier or "",
                    "switchyard.route_reason": route.header(),
                    "switchyard.candidates": list(route.deployments),
                }
            )
    key = ctx.key
    if key is not None and not key.allows(ctx.requested_model, route.tier):
        raise PermissionDeniedError(
            f"The key '{key.name}' may not use the model '{ctx.requested_model}'.",
            param="model",
            code="model_not_allowed",
        )
    return route


def _set_route(ctx: RequestContext, route: Route) -> None:
    ctx.tier = route.tier
    ctx.route_reason = route.header()


async def _unary(
    ctx: RequestContext, dispatcher: Dispatcher, route: Route, endpoint: str, body: dict[str, Any]
) -> UnaryResult:
    """A non-stream request; a fast answer that fails the policy's escalation check is asked
    again, once, of the escalation tier."""
    result = await dispatcher.unary(ctx, route, endpoint, body)
    if endpoint != "/chat/completions":
        return result
    policy = ctx.snapshot.policy
    reason = escalation_reason(policy, route, body, result.body)
    if reason is None:
        return result
    ctx.escalated = reason
    stronger = tier_route(
        policy, policy.routing.escalation.to, f"escalation:{reason}", escalated_from=route.tier
    )
    _set_route(ctx, stronger)
    return await dispatcher.unary(ctx, stronger, endpoint, body)


def _proxy(endpoint: str, schema: type[BaseModel], streamable: bool) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        ctx: RequestContext = request[CTX]
        body = await _read_json(request)
        ctx.timeout_override = timeout_override(request.headers.get("x-switchyard-timeout"))
        dispatcher = request.app[DISPATCHER]
        route = _prepare(request, ctx, schema, body)
        await _admit(request, ctx)
        if not (streamable and body.get("stream") is True):
            result = await _unary(ctx, dispatcher, route, endpoint, body)
            request.app[SHAPING].prefix_hit(ctx)
            return web.Response(
                body=result.body, headers=_route_headers(ctx), content_type=result.content_type.split(";")[0]
            )
        ctx.stream = True
        opened = await dispatcher.open_stream(ctx, route, endpoint, body)
        request.app[SHAPING].prefix_hit(ctx)
        return await _forward_stream(request, ctx, opened)

    return handle


async def fanout(request: web.Request) -> web.Response:
    """``POST /v1/fanout``: chat completions run concurrently; results in input order."""
    parent: RequestContext = request[CTX]
    spec = parse_fanout(await _read_json(request))
    override = timeout_override(request.headers.get("x-switchyard-timeout"))
    dispatcher = request.app[DISPATCHER]

    async def one(index: int, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        ctx = RequestContext(
            request_id=f"{parent.request_id}.{index}",
            endpoint="/v1/chat/completions",
            snapshot=parent.snapshot,
            key_id=parent.key_id,
            key=parent.key,
            timeout_override=override,
            # Items are traced inside the fan-out's span (their attempts are its children).
            tracer=parent.tracer,
            span=parent.span,
        )
        try:
            if body.get("stream") is True:
                raise InvalidRequestError("Fan-out items cannot stream.", param="stream")
            route = _prepare(request, ctx, ChatCompletionRequest, body)
            await _admit(request, ctx)
            result = await _unary(ctx, dispatcher, route, "/chat/completions", body)
            request.app[SHAPING].prefix_hit(ctx)
        except SwitchyardError as exc:
            ctx.status, ctx.error_code = exc.status, exc.code
            return exc.status, _route_headers(ctx), exc.to_json()
        except asyncio.CancelledError:
            ctx.status, ctx.error_code = 504, "fanout_item_timeout"
            raise
        finally:
            if not ctx.status:
                ctx.status = 200
            ctx.finished_at = time.perf_counter()
            _finish(request.app, ctx)
        return 200, _route_headers(ctx), result.body

    results = await run_fanout(spec, one)
    return web.Response(body=results, content_type="application/json", headers=_route_headers(parent))


async def _forward_stream(
    request: web.Request, ctx: RequestContext, opened: OpenStream
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={**_route_headers(ctx), **_SSE_HEADERS})
    # Everything up to [DONE] is written as it arrives; the last bytes go out together
    # with the end of the response (one write instead of two).
    tail = b""
    try:
        await resp.prepare(request)
        if opened.scanner.done:
            tail = opened.first
        else:
            await resp.write(opened.first)
        async for out in opened.rest():
            if opened.scanner.done:
                tail += out
            else:
                await resp.write(out)
    except SwitchyardError as exc:
        # Headers are gone; end the stream with an error event, never a silent cut.
        ctx.error_code = exc.code
        exc.message = _scrub(request.app, ctx.snapshot, exc.message)
        tail += sse_error_event(exc)
    except ConnectionError:
        ctx.status = 499
        ctx.error_code = "client_disconnected"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not (request.app[DRAINING].is_set() and task is not None and task.uncancel() == 0):
            raise
        # Cancelled by the drain deadline with the stream still running: end it with an
        # error event the SDKs raise on, rather than cutting it silently.
        err = _shutdown_error()
        ctx.error_code = err.code
        tail += sse_error_event(err)
    finally:
        opened.close()
        ctx.usage = opened.scanner.usage
        if opened.scanner.error is not None and ctx.error_code is None:
            ctx.error_code = str(opened.scanner.error.get("code") or "upstream_stream_error")
    if ctx.status != 499:
        with contextlib.suppress(ConnectionError):
            await resp.write_eof(tail)
    return resp


def _models_body(snapshot: PolicySnapshot, ctx: RequestContext) -> bytes:
    created = int(snapshot.loaded_at)
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "switchyard"}
                for name in model_names(snapshot.policy)
                if ctx.key is None or ctx.key.allows(name)
            ],
        }
    )


async def list_models(request: web.Request) -> web.Response:
    ctx: RequestContext = request[CTX]
    return web.Response(body=_models_body(ctx.snapshot, ctx), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    ctx: RequestContext = request[CTX]
    name = request.match_info["model"]
    if name not in model_names(ctx.snapshot.policy) or (ctx.key is not None and not ctx.key.allows(name)):
        raise ModelNotFoundError(name)
    body = {"id": name, "object": "model", "created": int(ctx.snapshot.loaded_at), "owned_by": "switchyard"}
    return json_response(body)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "pid": os.getpid()})


def _policy_status(holder: PolicyHolder) -> dict[str, Any]:
    snap = holder.current
    error = holder.reload_error
    return {
        "source": snap.source,
        "version": snap.version,
        "digest": snap.digest,
        "loaded_at": snap.loaded_at,
        "reload_error": None if error is None else [str(i) for i in error.issues],
        "deployments": list(snap.policy.deployments),
        "tiers": {name: [m.deployment for m in members] for name, members in snap.policy.tiers.items()},
    }


async def readyz(request: web.Request) -> web.Response:
    """Ready when a policy is loaded; shows a failed reload and whether Redis answers
    (a Redis outage does not make the gateway unready: it keeps serving without stats)."""
    redis_ok = True
    try:
        async with asyncio.timeout(0.5):
            await request.app[REDIS].ping()
    except Exception:
        redis_ok = False
    holder = request.app[POLICY]
    body = {
        "status": "ready",
        "policy": _policy_status(holder),
        "redis": redis_ok,
        "replicas": readiness(request.app[POOL], list(holder.current.policy.deployments)),
    }
    return json_response(body)


def require_admin(request: web.Request) -> None:
    """Admin endpoints need ``Authorization: Bearer $SWITCHYARD_ADMIN_KEY``; without an admin
    key configured they are open only on a gateway bound to loopback."""
    settings = request.app[SETTINGS]
    if settings.admin_key is None:
        if is_loopback(settings.host):
            return
        raise PermissionDeniedError("Admin API is disabled: set SWITCHYARD_ADMIN_KEY.")
    given = request.headers.get("Authorization", "")
    token = given[7:] if given.startswith("Bearer ") else ""
    if not hmac.compare_digest(token.encode(), settings.admin_key.encode()):
        raise PermissionDeniedError("Admin API needs the admin key.", code="invalid_admin_key")


async def admin_policy(request: web.Request) -> web.Response:
    require_admin(request)
    holder = request.app[POLICY]
    body = {**_policy_status(holder), "policy": _redacted_policy(holder.current)}
    return json_response(body)


async def admin_reload(request: web.Request) -> web.Response:
    require_admin(request)
    holder = request.app[POLICY]
    swapped = holder.reload()
    status = 200 if holder.reload_error is None else 422
    body = {"reloaded": swapped, **_policy_status(holder)}
    return json_response(body, status)


def _since_s(request: web.Request) -> int:
    raw = request.query.get("since", "1h")
    try:
        value = float(parse_duration(raw))
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param="since") from None
    return max(60, min(int(value), cachestats.RETENTION_S))


async def _redis_report(request: web.Request, report: Any) -> web.Response:
    """An admin report read from Redis over ``?since=``; 503 when Redis does not answer."""
    require_admin(request)
    since = _since_s(request)
    policy = request.app[POLICY].current.policy
    try:
        async with asyncio.timeout(3.0):
            body = await report(policy, since)
    except (RedisError, OSError, TimeoutError) as exc:
        raise UpstreamUnavailableError(
            f"stats are unavailable: Redis did not answer ({type(exc).__name__})", code="stats_unavailable"
        ) from None
    return json_response(body)


async def admin_stats(request: web.Request) -> web.Response:
    """The cache-hit report per deployment, key and template."""
    return await _redis_report(request, request.app[ACCOUNTING].report)


async def admin_dashboard(request: web.Request) -> web.Response:
    """What ``GET /dashboard`` shows: latency, mix, errors, retries, cost, cache, per key."""
    return await _redis_report(request, request.app[DASHBOARD].report)


async def dashboard_page(request: web.Request) -> web.Response:
    """``GET /dashboard``: the static page (its data comes from ``/admin/dashboard``)."""
    return web.Response(
        body=request.app[DASHBOARD_HTML],
        content_type="text/html",
        headers={"Cache-Control": "no-cache", "X-Frame-Options": "DENY"},
    )


async def admin_replicas(request: web.Request) -> web.Response:
    """Replica-backed deployments: readiness, routing counts and the figures scraped from vLLM."""
    require_admin(request)
    deployments = list(request.app[POLICY].current.policy.deployments)
    return json_response(replica_status(request.app[POOL], deployments, request.app.get(SUPERVISOR)))


async def admin_dispatch(request: web.Request) -> web.Response:
    """Circuit states per deployment, retry/hedge/fallback counters and the budgets."""
    require_admin(request)
    return json_response(request.app[DISPATCHER].status())


async def _shutdown_tracing(app: web.Application) -> None:
    owned = app[TRACING]
    if owned is not None:
        # Flushes the batch processor (a blocking HTTP export at most): once, at exit.
        await asyncio.get_running_loop().run_in_executor(None, owned.shutdown)


def _sync_metrics(app: web.Application) -> None:
    dispatcher = app[DISPATCHER]
    stats = app.get(STATS)
    app[METRICS].sync(
        dispatcher.counters,
        dispatcher.breakers.transitions,
        dispatcher.breakers.status(),
        stats.dropped if stats is not None else 0,
        tlog.dropped_lines(),
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text format (every worker's figures with ``--workers N``)."""
    _sync_metrics(request.app)
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def _sync_metrics_forever(app: web.Application, interval_s: float = 1.0) -> None:
    # Other workers answer scrapes too: each keeps its shared-memory figures at most a second old.
    while True:
        await asyncio.sleep(interval_s)
        _sync_metrics(app)


async def admin_create_key(request: web.Request) -> web.Response:
    """``POST /admin/keys``: a new virtual key; the secret is in this answer only."""
    require_admin(request)
    body = await _read_json(request)
    name, rpm, tpm, budget, models = validate_new_key(
        body.get("name"), body.get("rpm"), body.get("tpm"), body.get("budget_usd"), body.get("models")
    )
    secret, record = await request.app[KEYS].create(name, rpm=rpm, tpm=tpm, budget_usd=budget, models=models)
    return json_response({"key": secret, **record.public()}, 201)


async def admin_list_keys(request: web.Request) -> web.Response:
    """``GET /admin/keys``: every key with its limits and spend, never a secret or hash."""
    require_admin(request)
    records = await request.app[KEYS].list()
    spend = await request.app[LIMITER].spend_usd([r.key_id for r in records])
    data = [{**r.public(), "spend_usd": round(spend[r.key_id], 9)} for r in records]
    return json_response({"object": "list", "data": data})


async def admin_revoke_key(request: web.Request) -> web.Response:
    """``DELETE /admin/keys/{id}``: revoke a key (its record stays for the spend history)."""
    require_admin(request)
    key_id = request.match_info["key_id"]
    record = await request.app[KEYS].revoke(key_id)
    if record is None:
        raise NotFoundError(f"No key with id '{key_id}'.", code="key_not_found")
    return json_response(record.public())


async def admin_costs(request: web.Request) -> web.Response:
    """``GET /admin/costs?days=7``: spend per day, per key and per deployment."""
    require_admin(request)
    raw = request.query.get("days", "7")
    if not raw.isdigit() or not 1 <= int(raw) <= cachestats.COST_RETENTION_DAYS:
        raise InvalidRequestError(
            f"'days' must be a whole number from 1 to {cachestats.COST_RETENTION_DAYS}.", param="days"
        )
    return json_response(await request.app[ACCOUNTING].costs(int(raw)))


async def _background(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    holder = app[POLICY]
    redis_url = settings.redis_url
    if redis_url is None:
        raise RuntimeError("no Redis URL: the CLI starts an embedded Redis when none is configured")
    app[REDIS] = connect(redis_url)
    app[STATS] = StatsWriter(app[REDIS])
    app[ACCOUNTING] = Accounting(app[STATS], app[REDIS])
    app[DASHBOARD] = DashboardStats(app[STATS], app[REDIS], app[ACCOUNTING])
    app[KEYS] = KeyStore(app[REDIS], cache_s=settings.key_cache_s)
    app[LIMITER] = Limiter(app[REDIS], app[STATS])
    dispatcher = app[DISPATCHER]

    def apply(snapshot: PolicySnapshot) -> None:
        app[POOL].update(snapshot.policy)
        dispatcher.configure(snapshot.policy)

    apply(holder.current)
    holder.on_change(apply)
    tasks = [
        asyncio.create_task(holder.watch(settings.reload_interval_s), name="policy-watch"),
        asyncio.create_task(app[STATS].run(), name="stats-writer"),
        asyncio.create_task(dispatcher.breakers.share(app[REDIS]), name="circuit-share"),
        asyncio.create_task(app[SHAPING].stability.sync(app[REDIS]), name="stability-sync"),
        asyncio.create_task(_sync_metrics_forever(app), name="metrics-sync"),
        asyncio.create_task(app[KEYS].watch_revocations(), name="key-revocations"),
    ]
    expectations = asyncio.create_task(app[ACCOUNTING].run(), name="cache-expectations")
    yield
    # Expectations first: their last batch goes through the stats writer's last flush.
    expectations.cancel()
    await asyncio.gather(expectations, return_exceptions=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await app[POOL].close()
    await app[REDIS].aclose()


def create_app(
    settings: Settings, holder: PolicyHolder | None = None, tracer: tracing.Tracing | None = None
) -> web.Application:
    """The gateway application for ``settings`` (the policy is loaded here unless given).

    Tracing is ``tracer`` when given (tests pass one with an in-memory exporter), else what
    the ``OTEL_*`` variables configure (off by default)."""
    app = web.Application(middlewares=[context_middleware], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[AUTH_MODE] = settings.auth_mode()
    app[SECRETS] = {}
    app[DRAINING] = asyncio.Event()
    app[IN_FLIGHT] = set()
    app[POLICY] = holder or PolicyHolder(settings.policy)
    pool = UpstreamPool()
    app[POOL] = pool
    app[DISPATCHER] = Dispatcher(pool)
    app[SHAPING] = Shaping()
    app[METRICS] = Metrics()
    app[DASHBOARD_HTML] = DASHBOARD_PAGE.read_bytes()
    app[TRACING] = tracer if tracer is not None else tracing.Tracing.from_env()
    if tracer is None and app[TRACING] is not None:
        app.on_cleanup.append(_shutdown_tracing)
    app.cleanup_ctx.append(_background)
    app.router.add_post("/v1/chat/completions", _proxy("/chat/completions", ChatCompletionRequest, True))
    app.router.add_post("/v1/completions", _proxy("/completions", CompletionRequest, True))
    app.router.add_post("/v1/embeddings", _proxy("/embeddings", EmbeddingRequest, False))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/policy", admin_policy)
    app.router.add_post("/admin/reload", admin_reload)
    app.router.add_get("/admin/stats", admin_stats)
    app.router.add_get("/admin/dashboard", admin_dashboard)
    app.router.add_get("/dashboard", dashboard_page)
    app.router.add_get("/admin/replicas", admin_replicas)
    app.router.add_get("/admin/dispatch", admin_dispatch)
    app.router.add_post("/admin/keys", admin_create_key)
    app.router.add_get("/admin/keys", admin_list_keys)
    app.router.add_delete("/admin/keys/{key_id}", admin_revoke_key)
    app.router.add_get("/admin/costs", admin_costs)
    app.router.add_post("/v1/fanout", fanout)
    return app


class _JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser rejects (a malformed
    request line or header, an unknown Content-Encoding ...) in OpenAI's error JSON, logged
    as one line instead of a traceback."""

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp logs what it could not read as a traceback; one line says as much.
        exc = sys.exc_info()[1]
        _log_main.info(
            "http_connection_error", error=(str(exc).strip().splitlines() or [repr(exc)])[-1][:200]
        )

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        reason = message or (str(exc).strip().splitlines()[-1].strip() if exc else "") or "bad request"
        _log_main.info("bad_http_request", status=status, reason=reason[:200])
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
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return _Server(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )


async def _drain(app: web.Application, runner: _Runner, site: web.TCPSite) -> None:
    """Stop accepting; wait for the requests in flight up to the deadline; cancel the rest
    (each still answers: an error JSON, or an error event that ends its stream)."""
    deadline_s = app[SETTINGS].drain_timeout_s
    in_flight = app[IN_FLIGHT]
    app[DRAINING].set()
    _log_main.info("draining", pid=os.getpid(), in_flight=len(in_flight), deadline_s=deadline_s)
    await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close; busy ones after their request
    if in_flight:
        await asyncio.wait(set(in_flight), timeout=deadline_s)
    if in_flight:
        _log_main.warning("drain_deadline_passed", cancelled=len(in_flight))
        tasks = list(in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=2.0)


async def serve(app: web.Application, host: str, port: int, *, reuse_port: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let the requests and streams in
    flight finish for up to ``drain_timeout_s``, cancel what is left, and close."""
    import signal

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
    structlog.get_logger("switchyard").info(
        "listening", url=f"http://{host}:{port}", pid=os.getpid(), policy=app[POLICY].current.source
    )
    try:
        await stop.wait()
        await _drain(app, runner, site)
    finally:
        await runner.cleanup()
    _log_main.info("stopped", pid=os.getpid())
