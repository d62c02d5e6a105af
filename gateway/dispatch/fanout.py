"""``POST /v1/fanout`` (a Switchyard extension): many chat completions at once.

The body is ``{"requests": [<chat completion body>, ...], "max_concurrency": 16,
"timeout_s": 60}``; each item runs through the same routing, retries and fallbacks as a
single request, at most ``max_concurrency`` at a time, each bounded by ``timeout_s``. The
answer lists the results in input order; one failing item never fails the others:

    {"object": "fanout.result", "elapsed_ms": 812.4, "results": [
      {"index": 0, "status": 200, "headers": {"x-switchyard-model": "sim-fast", ...},
       "body": {<chat.completion>}},
      {"index": 1, "status": 504, "headers": {...},
       "body": {"error": {"message": ..., "type": ..., "param": null, "code": "fanout_item_timeout"}}}]}
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.dispatch.policy import Timeouts
from gateway.errors import InvalidRequestError, UpstreamTimeoutError
from gateway.validation import format_loc, parse_duration

ItemRunner = Callable[[int, dict[str, Any]], Awaitable[tuple[int, dict[str, str], bytes]]]


class FanoutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    requests: list[dict[str, Any]] = Field(min_length=1, max_length=1000)
    max_concurrency: int = Field(16, ge=1, le=256)
    timeout_s: float | None = Field(60.0, gt=0, le=3600)


def parse_fanout(body: dict[str, Any]) -> FanoutSpec:
    """Validate a fan-out body; a 400 naming the bad parameter otherwise."""
    try:
        return FanoutSpec.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        param = format_loc(tuple(err["loc"]))
        raise InvalidRequestError(f"Invalid value for '{param}': {err['msg']}.", param=param) from None


async def run_fanout(spec: FanoutSpec, run_one: ItemRunner) -> bytes:
    """Run every item (bounded concurrency, per-item timeout); the JSON answer."""
    started = time.perf_counter()
    slots = asyncio.Semaphore(spec.max_concurrency)

    async def item(index: int, body: dict[str, Any]) -> dict[str, Any]:
        async with slots:
            try:
                async with asyncio.timeout(spec.timeout_s):
                    status, headers, payload = await run_one(index, body)
            except TimeoutError:
                error = UpstreamTimeoutError(
                    f"fan-out item {index} did not finish within timeout_s={spec.timeout_s}",
                    code="fanout_item_timeout",
                )
                status, headers, payload = error.status, {}, error.to_json()
        # The item's JSON is embedded as it came, without parsing it again.
        return {"index": index, "status": status, "headers": headers, "body": orjson.Fragment(payload)}

    results = await asyncio.gather(*(item(i, body) for i, body in enumerate(spec.requests)))
    elapsed_ms = round((time.perf_counter() - started) * 1000.0, 2)
    return orjson.dumps({"object": "fanout.result", "elapsed_ms": elapsed_ms, "results": results})


def timeout_override(header: str | None) -> Timeouts | None:
    """Parse ``x-switchyard-timeout: first_token_s=5, total_s=30`` (a request may only tighten
    the policy's bounds); 400 naming the header when it is malformed."""
    if not header:
        return None
    values: dict[str, Any] = {}
    for part in header.split(","):
        name, sep, raw = part.strip().partition("=")
        if not sep or name not in Timeouts.model_fields:
            raise InvalidRequestError(
                f"x-switchyard-timeout: expected NAME=SECONDS with NAME one of "
                f"{', '.join(Timeouts.model_fields)}, got {part.strip()!r}",
                param="x-switchyard-timeout",
            )
        values[name] = raw.strip()
    try:
        return Timeouts.model_validate({k: parse_duration(v) for k, v in values.items()})
    except (ValueError, ValidationError) as exc:
        raise InvalidRequestError(f"x-switchyard-timeout: {exc}", param="x-switchyard-timeout") from None
