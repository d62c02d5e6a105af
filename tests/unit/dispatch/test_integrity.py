"""Issue #13 on virtual time: no answer is ever wrong or late because an upstream misbehaved.

The rule every test states: a client never receives a truncated, empty or error answer as
a success, and never waits past the bound the policy sets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.dispatch.attempt import OpenStream
from gateway.errors import SwitchyardError, UpstreamError
from gateway.providers.mock import MockRequest, MockResponse
from gateway.routing.resolve import Route
from tests.unit.dispatch.test_dispatcher import BODY, FAST, OK, ONLY_A, Handler, Setup, answer, sequence
from tests.unit.dispatch.virtual_time import run

STREAM = {**BODY, "stream": True}
CHUNK = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [{"delta": {"content": "x"}}]}


def raw(*chunks: bytes, delay_s: float = 0.0, status: int = 200, sse: bool = True) -> Handler:
    """An answer of exactly these body chunks."""
    kind = "text/event-stream" if sse else "application/json"

    async def handler(request: MockRequest) -> MockResponse:
        return MockResponse(status, {"Content-Type": kind}, list(chunks), delay_s)

    return handler


def stream_of(*events: Any, done: bool = True) -> Handler:
    async def handler(request: MockRequest) -> MockResponse:
        return MockResponse.sse(list(events), done=done)

    return handler


def hang_before_headers() -> Handler:
    async def handler(request: MockRequest) -> MockResponse:
        await asyncio.sleep(10_000)
        raise AssertionError("unreachable")

    return handler


async def read_stream(opened: OpenStream) -> tuple[list[bytes], SwitchyardError | None]:
    """Every block the client would get, and the error that ended the stream (if any)."""
    blocks = [opened.first]
    try:
        async for block in opened.rest():
            blocks.append(block)
    except SwitchyardError as exc:
        return blocks, exc
    finally:
        opened.close()
    return blocks, None


def circuit(setup: Setup, name: str) -> dict[str, Any]:
    """A deployment's circuit as ``/admin/dispatch`` shows it."""

    async def get() -> dict[str, Any]:
        status: dict[str, Any] = setup.dispatcher.breakers.status()[name]
        return status

    return run(get())


def now() -> float:
    return asyncio.get_running_loop().time()


# --- 1. the end is the [DONE] event itself ----------------------------------------------


def test_done_inside_content_then_a_cut_is_stream_incomplete_and_nothing_is_held_back() -> None:
    tricky = {**CHUNK, "choices": [{"delta": {"content": "streams end with data: [DONE]\n\n"}}]}
    setup = Setup({"a": raw(*MockResponse.sse([CHUNK, tricky, CHUNK], done=False).chunks, delay_s=1.0)})

    async def go() -> tuple[list[tuple[float, bytes]], SwitchyardError | None]:
        opened = await setup.dispatcher.open_stream(setup.ctx(), ONLY_A, "/chat/completions", STREAM)
        got = [(now(), opened.first)]
        try:
            async for block in opened.rest():
                got.append((now(), block))
        except SwitchyardError as exc:
            return got, exc
        finally:
            opened.close()
        return got, None

    got, error = run(go())
    assert error is not None and error.code == "stream_incomplete"
    # Each event reached the client when it arrived (1 s apart), the tricky one included.
    assert [round(t - got[0][0]) for t, _ in got] == [0, 1, 2]
    assert b"data: [DONE]" in got[1][1]


# --- 2. every event is complete JSON -------------------------------------------------------


def test_an_event_ending_in_a_brace_but_invalid_ends_the_stream_with_an_error() -> None:
    good = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    setup = Setup({"a": raw(good, b'data: {"choices": [}\n\n', good, b"data: [DONE]\n\n")})

    async def go() -> tuple[list[bytes], SwitchyardError | None]:
        opened = await setup.dispatcher.open_stream(setup.ctx(), ONLY_A, "/chat/completions", STREAM)
        return await read_stream(opened)

    blocks, error = run(go())
    assert b"".join(blocks) == good
    assert error is not None and error.code == "malformed_chunk"


def test_an_invalid_first_event_is_retried_on_the_next_deployment() -> None:
    setup = Setup({"a": raw(b'data: {"choices": [}\n\n', b"data: [DONE]\n\n"), "b": stream_of(CHUNK)})
    ctx = setup.ctx()

    async def go() -> tuple[list[bytes], SwitchyardError | None]:
        return await read_stream(await setup.dispatcher.open_stream(ctx, FAST, "/chat/completions", STREAM))

    blocks, error = run(go())
    assert error is None and b"".join(blocks).endswith(b"data: [DONE]\n\n")
    assert (ctx.deployment, ctx.attempts) == ("b", 2)


# --- 3. non-stream 200s are validated before anything reaches the client -------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"error": {"message": "The server is overloaded", "type": "server_error"}}', "error_answer"),
        (
            b'{"id": "x", "object": "chat.completion", "choices": [{"message": {"content": "cu',
            "invalid_answer",
        ),
        (b'{"id": "x", "choices": [}', "invalid_answer"),
        (b"", "empty_answer"),
    ],
)
def test_a_bad_200_is_retried_on_the_fallback_and_counts_against_the_circuit(
    body: bytes, reason: str
) -> None:
    bad = raw(body, sse=False) if body else raw(sse=False)
    setup = Setup({"a": bad, "c": answer()}, "{fallback: {fast: [strong]}, circuit: {shared: false}}")
    ctx = setup.ctx()
    result = run(setup.dispatcher.unary(ctx, ONLY_A, "/chat/completions", BODY))
    assert b'"choices"' in result.body and (ctx.deployment, ctx.fallback_tier) == ("c", "strong")
    assert circuit(setup, "a")["last_failure"] == reason
    assert circuit(setup, "a")["window_failures"] == 1


def test_a_bad_200_with_nowhere_to_go_is_a_502_never_a_success() -> None:
    setup = Setup({"a": raw(b'{"error": {"message": "boom"}}', sse=False)}, "{retries: {max: 0}}")
    with pytest.raises(UpstreamError) as info:
        run(setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY))
    assert (info.value.http_status, info.value.code) == (502, "error_answer")


def test_an_embeddings_answer_without_data_is_invalid() -> None:
    setup = Setup({"a": answer(obj={"object": "list"}), "b": answer(obj={"object": "list", "data": []})})
    ctx = setup.ctx()
    result = run(setup.dispatcher.unary(ctx, FAST, "/embeddings", {"model": "fast", "input": "x"}))
    assert b'"data"' in result.body and ctx.deployment == "b"


# --- 4. non-stream first byte bound, total_s across attempts -------------------------------


def test_a_non_stream_hang_before_headers_falls_back_after_first_byte_s() -> None:
    setup = Setup({"a": hang_before_headers(), "b": answer()}, "{timeouts: {first_byte_s: 2}}")
    ctx = setup.ctx()

    async def go() -> float:
        start = now()
        await setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        return now() - start

    assert run(go()) == pytest.approx(2.0)
    assert ctx.deployment == "b"


def test_headers_then_hang_is_a_first_byte_timeout() -> None:
    setup = Setup({"a": raw(b'{"choices": []}', delay_s=10_000, sse=False)}, "{timeouts: {first_byte_s: 3}}")
    with pytest.raises(UpstreamError) as info:
        run(setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY))
    assert (info.value.code, info.value.http_status) == ("first_byte_timeout", 504)


def test_first_byte_timeout_is_retried_by_default() -> None:
    setup = Setup({"a": sequence(hang_before_headers(), answer())}, "{timeouts: {first_byte_s: 1}}")
    ctx = setup.ctx()
    run(setup.dispatcher.unary(ctx, ONLY_A, "/chat/completions", BODY))
    assert (ctx.attempts, setup.calls("a")) == (2, 2)


def test_total_s_bounds_the_whole_request_across_attempts() -> None:
    setup = Setup(
        {"a": hang_before_headers(), "b": hang_before_headers(), "c": hang_before_headers()},
        "{timeouts: {first_byte_s: 4, total_s: 10}, fallback: {fast: [strong]}, retries: {max: 5}}",
    )
    ctx = setup.ctx()

    async def go() -> tuple[float, UpstreamError]:
        start = now()
        try:
            await setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        except UpstreamError as exc:
            return now() - start, exc
        raise AssertionError("a hung upstream answered")

    waited_s, error = run(go())
    assert waited_s <= 10.0 + 1e-6  # not 3 x first_byte_s = 12, not total_s per attempt
    assert error.code in ("total_timeout", "first_byte_timeout") and ctx.attempts == 3


def test_total_s_also_ends_a_stream_that_took_its_time() -> None:
    slow = MockResponse.sse([CHUNK] * 10).chunks

    setup = Setup({"a": raw(*slow, delay_s=1.0)}, "{timeouts: {total_s: 4.5, first_token_s: 2, idle_s: 5}}")

    async def go() -> tuple[list[bytes], SwitchyardError | None]:
        return await read_stream(
            await setup.dispatcher.open_stream(setup.ctx(), ONLY_A, "/chat/completions", STREAM)
        )

    blocks, error = run(go())
    assert error is not None and error.code == "total_timeout" and len(blocks) == 4


# --- 5. under load: panic routing, bursts of timeouts, hedged non-stream -------------------


def test_when_every_circuit_is_open_one_deployment_is_tried_anyway() -> None:
    healthy = False

    async def flaky(request: MockRequest) -> MockResponse:
        return await answer(200 if healthy else 503)(request)

    setup = Setup(
        {"a": flaky, "b": flaky}, "{circuit: {consecutive_failures: 1, cooldown_s: 60, shared: false}}"
    )
    dispatcher = setup.dispatcher

    async def go() -> None:
        nonlocal healthy
        with pytest.raises(UpstreamError):
            await dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY)
        assert dispatcher.breakers.is_open("a") and dispatcher.breakers.is_open("b")
        healthy = True
        ctx = setup.ctx()
        await dispatcher.unary(ctx, FAST, "/chat/completions", BODY)  # not an instant 503
        assert ctx.deployment == "a" and not dispatcher.breakers.is_open("a")

    run(go())
    assert dispatcher.counters["panic_routed"] == 1


def test_a_burst_of_timeouts_among_successes_does_not_open_the_circuit() -> None:
    hung = 0

    async def sometimes_hangs(request: MockRequest) -> MockResponse:
        nonlocal hung
        if hung < 6:
            hung += 1
            await asyncio.sleep(10_000)
        return await answer()(request)

    setup = Setup(
        {"a": sometimes_hangs},
        "{timeouts: {first_byte_s: 2}, retries: {max: 0}, circuit: {consecutive_failures: 3, shared: false}}",
    )
    dispatcher = setup.dispatcher

    async def one() -> bool:
        try:
            await dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY)
            return True
        except UpstreamError:
            return False

    async def go() -> list[bool]:
        hung_ones = [asyncio.ensure_future(one()) for _ in range(6)]
        await asyncio.sleep(0.5)
        fine = [await one() for _ in range(3)]  # succeed while the six hang
        return fine + list(await asyncio.gather(*hung_ones))

    outcomes = run(go())
    assert outcomes == [True] * 3 + [False] * 6
    assert not dispatcher.breakers.is_open("a")
    assert circuit(setup, "a")["last_failure"] == "first_byte_timeout"


def test_a_hung_non_stream_attempt_is_hedged() -> None:
    setup = Setup(
        {"a": hang_before_headers(), "b": answer(delay_s=0.05)},
        "{timeouts: {first_byte_s: 30}, hedge: {enabled: true, after_s: 0.2}}",
    )
    ctx = setup.ctx()

    async def go() -> float:
        start = now()
        await setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY)
        return now() - start

    assert run(go()) < 0.3
    assert ctx.deployment == "b" and ctx.hedged


# --- 6. upstream 401/403 falls back, never retries the same deployment ---------------------


@pytest.mark.parametrize("status", [401, 403])
def test_rejected_credentials_fall_back_and_count_against_the_circuit(status: int) -> None:
    setup = Setup(
        {"a": answer(status, {"error": {"message": "Incorrect API key provided: sk-abc***"}}), "b": answer()},
        "{circuit: {consecutive_failures: 2, shared: false}, retries: {max: 3}}",
    )
    ctx = setup.ctx()
    run(setup.dispatcher.unary(ctx, FAST, "/chat/completions", BODY))
    assert ctx.deployment == "b" and setup.calls("a") == 1
    assert circuit(setup, "a")["last_failure"] == str(status)
    run(setup.dispatcher.unary(setup.ctx(), FAST, "/chat/completions", BODY))
    assert circuit(setup, "a")["state"] == "open"


def test_rejected_credentials_are_never_retried_on_the_same_deployment() -> None:
    setup = Setup({"a": answer(401)}, "{retries: {max: 3}}")
    with pytest.raises(UpstreamError) as info:
        run(setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY))
    assert info.value.code == "upstream_auth_failed" and info.value.http_status == 502
    assert setup.calls("a") == 1


# --- 7. failures before the first byte are retried on streams ------------------------------


@pytest.mark.parametrize(
    "first",
    [
        raw(),  # a 200 with no SSE event at all
        raw(b"data: [DONE]\n\n"),  # only the end marker
        raw(b'data: {"choices": [{"delta": {"content": "cut'),  # half an event, then closed
        stream_of({"error": {"message": "overloaded", "type": "server_error", "code": 503}}),
        stream_of({"object": "error", "message": "boom", "code": 500}, done=False),
    ],
    ids=["no_event", "only_done", "cut_event", "error_event", "vllm_error_event"],
)
def test_a_stream_that_fails_before_its_first_byte_is_retried(first: Handler) -> None:
    setup = Setup({"a": first, "b": stream_of(CHUNK)})
    ctx = setup.ctx()

    async def go() -> tuple[list[bytes], SwitchyardError | None]:
        return await read_stream(await setup.dispatcher.open_stream(ctx, FAST, "/chat/completions", STREAM))

    blocks, error = run(go())
    assert error is None and b'"content":"x"' in b"".join(blocks)
    assert (ctx.deployment, ctx.attempts) == ("b", 2)


def test_an_error_first_event_with_nowhere_to_go_is_an_error_not_a_success() -> None:
    setup = Setup({"a": stream_of({"error": {"message": "overloaded"}})}, "{retries: {max: 0}}")
    with pytest.raises(UpstreamError) as info:
        run(setup.dispatcher.open_stream(setup.ctx(), ONLY_A, "/chat/completions", STREAM))
    assert info.value.code == "error_answer"


# --- 8. [DONE] received but the connection kept open ---------------------------------------


class _KeepsOpen(MockResponse):
    """Sends its chunks, then holds the connection open without a byte more."""

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        await asyncio.sleep(10_000)


def test_the_stream_ends_at_done_even_if_the_upstream_keeps_the_connection_open() -> None:
    async def keeps_open(request: MockRequest) -> MockResponse:
        return _KeepsOpen(200, {"Content-Type": "text/event-stream"}, MockResponse.sse([CHUNK, CHUNK]).chunks)

    setup = Setup({"a": keeps_open}, "{timeouts: {idle_s: 30}}")
    ctx = setup.ctx()

    async def go() -> tuple[float, list[bytes], SwitchyardError | None]:
        start = now()
        opened = await setup.dispatcher.open_stream(ctx, ONLY_A, "/chat/completions", STREAM)
        blocks, error = await read_stream(opened)
        return now() - start, blocks, error

    took_s, blocks, error = run(go())
    assert error is None and b"".join(blocks).endswith(b"data: [DONE]\n\n")
    assert took_s == 0.0  # not idle_s
    assert circuit(setup, "a")["window_failures"] == 0


def test_ok_answers_still_pass() -> None:
    setup = Setup({"a": answer(obj=OK)})
    assert b'"id":"x"' in run(setup.dispatcher.unary(setup.ctx(), ONLY_A, "/chat/completions", BODY)).body


def test_after_done_the_connection_is_reused_when_the_body_ends_and_dropped_when_it_does_not() -> None:
    responses: list[MockResponse] = []

    def keeping(open_after_done: bool) -> Handler:
        async def handler(request: MockRequest) -> MockResponse:
            kind = _KeepsOpen if open_after_done else MockResponse
            response = kind(200, {"Content-Type": "text/event-stream"}, MockResponse.sse([CHUNK]).chunks)
            responses.append(response)
            return response

        return handler

    setup = Setup({"a": keeping(False), "b": keeping(True)})

    async def go() -> None:
        for route in (ONLY_A, Route("fast", ("b",), "default")):
            await read_stream(
                await setup.dispatcher.open_stream(setup.ctx(), route, "/chat/completions", STREAM)
            )
        await asyncio.sleep(1.0)  # past the drain's grace

    run(go())
    ended, kept_open = responses
    assert ended.released and not ended.closed
    assert kept_open.closed and not kept_open.released
