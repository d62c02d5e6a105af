"""Spans as the gateway makes them: the app in this process with the SDK's in-memory exporter
(structure, attributes, propagation both ways), the simulator as upstream, a real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.config import PolicyHolder, Settings
from gateway.http import create_app
from gateway.procutil import free_port
from gateway.telemetry.tracing import Tracing, enabled
from tests.helpers import SimServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
MESSAGES = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def tsim() -> Iterator[SimServer]:
    with SimServer("--model", "a:5:1", "--model", "b:5:1", "--model", "upstream-a:5:1") as server:
        yield server


def policy(sim: SimServer, extra: str = "") -> str:
    return f"""
deployments:
  a: {{base_url: "{sim.base_url}", model: upstream-a}}
  b: {{base_url: "{sim.base_url}"}}
tiers:
  fast: [a]
  strong: [b]
{extra}
"""


def serve_app(
    redis_url: str, tmp_path: Path, policy_text: str, body: Callable[[str], Awaitable[None]]
) -> list[ReadableSpan]:
    """Run the app on a loopback port with an in-memory exporter, call ``body(base_url)``, and
    return the finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text)
    port = free_port()
    settings = Settings(redis_url=redis_url, policy=str(path), port=port)

    async def main() -> None:
        app = create_app(settings, PolicyHolder(str(path)), tracer=Tracing(provider))
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await body(f"http://127.0.0.1:{port}/v1")
            await asyncio.sleep(0.05)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return list(exporter.get_finished_spans())


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_a_stream_request_span_continues_traceparent_with_children_and_gen_ai_attributes(
    redis_url: str, tmp_path: Path, tsim: SimServer
) -> None:
    tsim.reset()
    seen: dict[str, Any] = {}

    async def body(base_url: str) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="fast",
            messages=MESSAGES,
            stream=True,
            max_tokens=20,
            temperature=0.5,
            stream_options={"include_usage": True},
            extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        chunks = [c async for c in raw.parse()]
        seen["headers"] = raw.headers
        seen["usage"] = chunks[-1].usage

    spans = serve_app(redis_url, tmp_path, policy(tsim), body)
    [request] = [s for s in spans if s.kind == SpanKind.SERVER]
    assert request.name == "chat fast"
    assert f"{request.context.trace_id:032x}" == TRACE_ID, "the incoming trace is continued"
    assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
    attrs = request.attributes or {}
    usage = seen["usage"]
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "fast"
    assert attrs["gen_ai.response.model"] == "upstream-a"
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.max_tokens"] == 20 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attrs["switchyard.cached_tokens"] == (usage.prompt_tokens_details.cached_tokens or 0)
    assert attrs["switchyard.tier"] == "fast"
    assert attrs["switchyard.route_reason"] == seen["headers"]["x-switchyard-route"]
    assert attrs["switchyard.deployment"] == "a" and attrs["switchyard.stream"] is True
    assert isinstance(attrs["switchyard.stable_prefix_tokens"], int)
    assert attrs["http.response.status_code"] == 200
    [event] = [e for e in request.events if e.name == "first_token"]
    assert request.start_time is not None and request.end_time is not None
    assert request.start_time < event.timestamp < request.end_time
    # The response names the request span.
    assert seen["headers"]["traceparent"] == f"00-{TRACE_ID}-{request.context.span_id:016x}-01"

    children = {
        s.name: s for s in spans if s.parent is not None and s.parent.span_id == request.context.span_id
    }
    assert set(children) == {"shape", "route", "attempt a"}
    assert all(s.context.trace_id == request.context.trace_id for s in children.values())
    route = children["route"].attributes or {}
    assert route["switchyard.tier"] == "fast" and route["switchyard.candidates"] == ("a",)
    attempt = children["attempt a"]
    assert attempt.kind == SpanKind.CLIENT
    a_attrs = attempt.attributes or {}
    assert a_attrs["switchyard.outcome"] == "ok" and a_attrs["switchyard.attempt.number"] == 1
    assert a_attrs["switchyard.attempt.retry"] == 0 and a_attrs["switchyard.attempt.hedge"] is False
    # The upstream got the attempt span's context.
    sent = tsim.stats()["recent"][-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{attempt.context.span_id:016x}-01"


def test_retries_and_hedges_are_attempt_spans_with_their_outcome(
    redis_url: str, tmp_path: Path, tsim: SimServer
) -> None:
    tsim.reset()
    tsim.set_fault("upstream-a", "error=500", count=1)

    took: list[float] = []

    async def body(base_url: str) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        started = time.monotonic()
        await client.chat.completions.create(model="fast", messages=MESSAGES)
        took.append(time.monotonic() - started)

    extra = "dispatch:\n  retries: {max: 2, backoff: {base_s: 0.01}}"
    spans = serve_app(redis_url, tmp_path, policy(tsim, extra), body)
    attempts = sorted(by_name(spans, "attempt a"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["switchyard.outcome"] for s in attempts] == ["500", "ok"]
    assert [(s.attributes or {})["switchyard.attempt.retry"] for s in attempts] == [0, 1]
    assert [(s.attributes or {})["switchyard.attempt.number"] for s in attempts] == [1, 2]
    assert attempts[0].status.status_code == StatusCode.ERROR
    assert (attempts[0].attributes or {})["http.response.status_code"] == 500

    tsim.reset()
    tsim.set_fault("upstream-a", "slow_first_token=1500", count=1)
    hedge = "dispatch:\n  hedge: {enabled: true, after_s: 0.1, budget_ratio: 1.0}"
    tiers = policy(tsim, hedge).replace("fast: [a]", "fast: [a, b]")
    spans = serve_app(redis_url, tmp_path, tiers, body)
    assert took[-1] < 1.4, "the hedge answered before the slow first attempt's 1.5 s"
    [request] = [s for s in spans if s.kind == SpanKind.SERVER]
    first, twin = by_name(spans, "attempt a")[0], by_name(spans, "attempt b")[0]
    assert (first.attributes or {})["switchyard.outcome"] == "cancelled"
    assert (twin.attributes or {})["switchyard.attempt.hedge"] is True
    assert (twin.attributes or {})["switchyard.outcome"] == "ok"
    assert (
        first.parent
        and twin.parent
        and first.parent.span_id == twin.parent.span_id == request.context.span_id
    )
    assert (request.attributes or {})["switchyard.hedged"] is True


def test_tracing_is_off_unless_an_otlp_endpoint_or_exporter_is_set() -> None:
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert enabled({"OTEL_TRACES_EXPORTER": "console"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert Tracing.from_env({}) is None
