"""What dispatch itself costs a request, in process, with an upstream that answers at once.

    python bench/probes/dispatch_cost.py [--reps 15] [--n 1000] [--per-event]

The transport hands back a canned chat completion (about 1 KB) or a 20-token SSE stream
(6 KB, in 1 KB reads, or one read per event with ``--per-event``) without I/O, so what is
timed is the gateway's own work: the attempt (timeouts, the provider's request and answer
checks, the stream scanner), and around it the dispatcher (candidates, budgets, circuits,
hedging). Process CPU per request, best and median of ``--reps`` batches of ``--n``
sequential requests on uvloop:

- ``attempt``: ``unary_attempt`` alone, no dispatcher;
- ``unary`` / ``stream``: ``Dispatcher.unary``, ``Dispatcher.open_stream`` + ``rest()``;
- ``hedged`` / ``hedged-stream``: the same with ``hedge: {enabled: true, after_s: 5}``
  (a twin never starts: what hedging costs a request that is not slow).

Run it with ``PYTHONPATH`` set to the tree to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson
import uvloop
from multidict import CIMultiDict

from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.dispatch.attempt import unary_attempt
from gateway.dispatch.dispatcher import Dispatcher
from gateway.providers.pool import UpstreamPool
from gateway.providers.transport import Transport, TransportResponse
from gateway.routing.resolve import Route

POLICY = """
deployments:
  canned: {base_url: "http://127.0.0.1:9/v1"}
  canned-stream: {base_url: "http://127.0.0.1:9/v1"}
tiers: {fast: [canned], strong: [canned-stream]}
"""
HEDGED = POLICY + "dispatch: {hedge: {enabled: true, after_s: 5}}\n"
BODY = {"model": "canned", "messages": [{"role": "user", "content": "hello there " * 20}]}
_ANSWER = {
    "id": "chatcmpl-probe",
    "object": "chat.completion",
    "created": 1733130000,
    "model": "canned",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "word " * 150}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 412, "completion_tokens": 20, "total_tokens": 432},
}
JSON = orjson.dumps(_ANSWER)


def _sse_events() -> list[bytes]:
    base = {
        "id": "chatcmpl-probe",
        "object": "chat.completion.chunk",
        "created": 1733130000,
        "model": "canned",
    }
    events = []
    for i in range(20):
        delta = {"role": "assistant", "content": "word "} if i == 0 else {"content": "word " * 40}
        choice = {"index": 0, "delta": delta, "finish_reason": "stop" if i == 19 else None}
        events.append(orjson.dumps({**base, "choices": [choice], "usage": None}))
    events.append(orjson.dumps({**base, "choices": [], "usage": _ANSWER["usage"]}))
    return [b"data: " + e + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


class _Canned(TransportResponse):
    """An answer already complete: its reads come from a list."""

    def __init__(self, parts: list[bytes], content_type: str) -> None:
        self.status = 200
        self.headers: Mapping[str, str] = CIMultiDict({"Content-Type": content_type})
        self._parts = parts
        self._next = 0

    def __aiter__(self) -> _Canned:
        return self

    async def __anext__(self) -> bytes:
        if self._next >= len(self._parts):
            raise StopAsyncIteration
        self._next += 1
        return self._parts[self._next - 1]

    async def read(self) -> bytes:
        return b"".join(self._parts)

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self

    def complete(self) -> bool:
        return self._next >= len(self._parts)

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


class _Instant(Transport):
    def __init__(self, parts: list[bytes], content_type: str) -> None:
        self._parts, self._type = parts, content_type

    @property
    def ready(self) -> bool:
        return True

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        return _Canned(self._parts, self._type)

    async def close(self) -> None:
        pass


async def main(reps: int, n: int, per_event: bool) -> None:
    events = _sse_events()
    sse = b"".join(events)
    reads = events if per_event else [sse[i : i + 1024] for i in range(0, len(sse), 1024)]
    snapshots = {}
    for name, text in (("plain", POLICY), ("hedged", HEDGED)):
        policy = parse_policy(text, "probe.yaml")
        snapshots[name] = PolicySnapshot(policy, "probe.yaml", name, 1)
    pool = UpstreamPool()
    pool.update(snapshots["plain"].policy)
    pool.get("canned").transport = _Instant([JSON], "application/json")
    pool.get("canned-stream").transport = _Instant(reads, "text/event-stream")
    dispatcher = Dispatcher(pool)
    dispatcher.configure(snapshots["plain"].policy)
    unary_route = Route("fast", ("canned",), "probe")
    stream_route = Route("strong", ("canned-stream",), "probe")
    timeouts = snapshots["plain"].timeouts("canned", "fast")

    def ctx(snapshot: str, model: str) -> RequestContext:
        return RequestContext("req", "/v1/chat/completions", snapshots[snapshot], requested_model=model)

    async def attempt() -> None:
        deadline = asyncio.get_running_loop().time() + 600.0
        await unary_attempt(
            ctx("plain", "canned"),
            pool,
            pool.acquire("canned"),
            timeouts,
            "/chat/completions",
            BODY,
            deadline,
        )

    async def unary(snapshot: str) -> None:
        await dispatcher.unary(ctx(snapshot, "canned"), unary_route, "/chat/completions", BODY)

    async def stream(snapshot: str) -> None:
        body = dict(BODY, stream=True)
        opened = await dispatcher.open_stream(
            ctx(snapshot, "canned-stream"), stream_route, "/chat/completions", body
        )
        try:
            async for _ in opened.rest():
                pass
        finally:
            opened.close()

    cases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("attempt", attempt),
        ("unary", lambda: unary("plain")),
        ("stream", lambda: stream("plain")),
        ("hedged", lambda: unary("hedged")),
        ("hedged-stream", lambda: stream("hedged")),
    ]
    for label, run_one in cases:
        for _ in range(n):
            await run_one()
        samples = []
        for _ in range(reps):
            start = time.process_time()
            for _ in range(n):
                await run_one()
            samples.append((time.process_time() - start) / n * 1e6)
        print(f"{label:14} {min(samples):7.1f} µs (median {statistics.median(samples):.1f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--per-event", action="store_true", help="one read per SSE event (23 reads)")
    args = parser.parse_args()
    uvloop.run(main(args.reps, args.n, args.per_event))
