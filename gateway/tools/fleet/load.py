"""The fleet test bed's load generator: open-loop chat requests spread over the gateways.

It is also the bed's load balancer: each request goes to the next gateway of
``rotation()`` (round robin), so a gateway taken out of it (as a Kubernetes endpoint is
before its pod's preStop pause) gets no new requests. It records what a client saw of
every request: status, the gateway that answered, the usage it was told and whether a
stream ended with its end marker, so the fleet's own figures can be checked against it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass(slots=True)
class Outcome:
    """What the client saw of one request."""

    gateway: str
    status: int
    started: float
    ended: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    request_id: str = ""
    usage: dict[str, Any] | None = None
    limit_checked: bool = False
    """The answer carried ``x-ratelimit-*`` headers: the key's limits were checked in Redis
    (a gateway that found Redis unreachable admits without them: limits fail open)."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass(slots=True)
class LoadResult:
    """Every request's :class:`Outcome`, in the order they were sent."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, predicate: Callable[[Outcome], bool] = lambda o: True) -> int:
        return sum(1 for o in self.outcomes if predicate(o))

    @property
    def admitted(self) -> int:
        return self.count(lambda o: o.ok)

    @property
    def limited(self) -> int:
        return self.count(lambda o: o.status == 429)

    @property
    def failed(self) -> list[Outcome]:
        """Requests neither answered nor refused by a rate limit: the ones that count as failures."""
        return [o for o in self.outcomes if not o.ok and o.status != 429]

    def tokens(self) -> tuple[int, int, int]:
        """Prompt, cached and completion tokens over the answered requests."""
        ok = [o for o in self.outcomes if o.ok]
        return (
            sum(o.prompt_tokens for o in ok),
            sum(o.cached_tokens for o in ok),
            sum(o.completion_tokens for o in ok),
        )


def chat_body(
    system: str, user: str, *, stream: bool = False, max_tokens: int = 8, model: str = "fast"
) -> dict[str, Any]:
    """A chat request with ``system`` first (the stable prefix) and ``user`` last."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def one_request(
    session: aiohttp.ClientSession, gateway: str, key: str, body: dict[str, Any], request_id: str
) -> Outcome:
    """Send ``body`` to ``gateway``; a stream is read to its end."""
    out = Outcome(gateway=gateway, status=0, started=time.monotonic(), request_id=request_id)
    headers = {"Authorization": f"Bearer {key}", "x-request-id": request_id}
    try:
        async with session.post(gateway + "/v1/chat/completions", json=body, headers=headers) as resp:
            out.status = resp.status
            out.limit_checked = any(h.lower().startswith("x-ratelimit-") for h in resp.headers)
            if resp.status != 200:
                await resp.read()
            elif body.get("stream"):
                _read_usage(out, await _read_stream(resp, out))
            else:
                _read_usage(out, (await resp.json(loads=orjson.loads)).get("usage"))
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        out.error = type(exc).__name__
    out.ended = time.monotonic()
    return out


async def _read_stream(resp: aiohttp.ClientResponse, out: Outcome) -> dict[str, Any] | None:
    usage, done = None, False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        event = orjson.loads(data)
        if "error" in event:
            out.error = "stream_error"
        usage = event.get("usage") or usage
    if not done and out.error is None:
        out.error = "stream_cut"
    return usage


def _read_usage(out: Outcome, usage: dict[str, Any] | None) -> None:
    if not usage:
        return
    out.usage = usage
    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    out.completion_tokens = int(usage.get("completion_tokens") or 0)
    out.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def run_load(
    rotation: Callable[[], list[str]],
    key: str,
    body: Callable[[int], dict[str, Any]],
    *,
    rate_per_s: float,
    duration_s: float,
    timeout_s: float = 30.0,
    tag: str = "load",
    until: asyncio.Event | None = None,
) -> LoadResult:
    """Send ``rate_per_s`` requests a second for ``duration_s`` or until ``until`` is set
    (open loop: a slow answer does not slow the sending), request ``i`` with ``body(i)``,
    round robin over ``rotation()`` as it is at each send; wait for every answer."""
    result = LoadResult()
    interval = 1.0 / rate_per_s
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = []
        start = time.monotonic()
        counter = itertools.count()
        for i in counter:
            send_at = start + i * interval
            if send_at - start >= duration_s or (until is not None and until.is_set()):
                break
            delay = send_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            targets = rotation()
            gateway = targets[i % len(targets)]
            tasks.append(asyncio.create_task(one_request(session, gateway, key, body(i), f"{tag}-{i}")))
        result.outcomes = list(await asyncio.gather(*tasks))
    return result
