"""A real gateway process exports its spans over OTLP/HTTP, configured only by ``OTEL_*``
variables, to a real receiver in this test that decodes the protobuf it is sent."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.procutil import free_port
from tests.helpers import SimServer, sim_policy

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


class OtlpReceiver:
    """``POST /v1/traces`` (OTLP/HTTP, protobuf) on a loopback port, in a thread of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _traces(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        self.requests.append(message)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """(resource attributes, span) for every span received so far."""
        out = []
        for message in list(self.requests):
            for resource_spans in message.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out


def plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attributes(items: Any) -> dict[str, Any]:
    return {kv.key: plain(kv.value) for kv in items}


@pytest.fixture()
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def test_the_gateway_exports_its_spans_over_otlp_http(
    make_gateway: Any, sim: SimServer, receiver: OtlpReceiver
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_SERVICE_NAME": "switchyard-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    gw = make_gateway(sim_policy(sim.base_url), env=env)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="strong",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
    )
    assert list(stream)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(receiver.spans()) < 4:
        time.sleep(0.05)
    received = receiver.spans()
    assert receiver.content_types and set(receiver.content_types) == {"application/x-protobuf"}
    assert {resource["service.name"] for resource, _ in received} == {"switchyard-under-test"}
    spans = {span.name: span for _, span in received}
    assert set(spans) == {"chat strong", "shape", "route", "attempt sim-strong"}
    request = spans["chat strong"]
    assert request.trace_id.hex() == TRACE_ID and request.parent_span_id.hex() == PARENT_ID
    assert request.kind == Span.SPAN_KIND_SERVER
    for name in ("shape", "route", "attempt sim-strong"):
        assert spans[name].trace_id == request.trace_id
        assert spans[name].parent_span_id == request.span_id, name
    attrs = attributes(request.attributes)
    assert attrs["gen_ai.request.model"] == "strong" and attrs["switchyard.tier"] == "strong"
    assert attrs["gen_ai.usage.output_tokens"] > 0 and attrs["gen_ai.usage.input_tokens"] > 0
    assert [event.name for event in request.events] == ["first_token"]
    sent = sim.stats()["recent"][-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{spans['attempt sim-strong'].span_id.hex()}-01"


def test_without_otel_variables_nothing_is_traced(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(sim_policy(sim.base_url))
    raw = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0).chat.completions.with_raw_response
    reply = raw.create(
        model="fast",
        messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
    )
    assert "traceparent" not in reply.headers
    # The client's own traceparent is not forwarded either: the gateway is not in the trace.
    assert sim.stats()["recent"][-1]["traceparent"] is None
