"""The simulator's Messages API as the official anthropic SDK sees it: shapes, streams,
tools, cache usage, count_tokens and Anthropic's errors (529 included)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from local_backend.sim import ModelProfile, SimConfig, SimThread

SYSTEM = "You are a careful assistant who answers in one paragraph. " * 80  # ~1,100 tokens
TOOL = {"name": "lookup", "description": "Look a word up.", "input_schema": {"type": "object"}}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimThread]:
    config = SimConfig(
        models={"claude-sim": ModelProfile(ttft_ms=2, itl_ms=0.5)}, require_api_key="sk-ant-sim"
    )
    with SimThread(config) as running:
        yield running


@pytest.fixture()
def client(sim: SimThread) -> Iterator[anthropic.Anthropic]:
    sim.control.reset()
    with anthropic.Anthropic(base_url=sim.url, api_key="sk-ant-sim", max_retries=0, timeout=10) as c:
        yield c


def test_message_shape_and_cache_usage(client: anthropic.Anthropic) -> None:
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(
        model="claude-sim", max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}]
    )
    assert first.type == "message" and first.role == "assistant" and first.model == "claude-sim"
    assert first.content[0].type == "text" and first.content[0].text and first.stop_reason == "end_turn"
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens > 1024
    second = client.messages.create(
        model="claude-sim", max_tokens=64, system=system, messages=[{"role": "user", "content": "other"}]
    )
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    unmarked = client.messages.create(
        model="claude-sim", max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
    )
    assert not unmarked.usage.cache_read_input_tokens and not unmarked.usage.cache_creation_input_tokens


def test_max_tokens_and_stop_sequences(client: anthropic.Anthropic) -> None:
    cut = client.messages.create(
        model="claude-sim", max_tokens=2, messages=[{"role": "user", "content": "x"}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens <= 2
    stopped = client.messages.create(
        model="claude-sim",
        max_tokens=200,
        stop_sequences=["the"],
        messages=[{"role": "user", "content": "x"}],
    )
    assert stopped.stop_reason in ("stop_sequence", "end_turn") and "the" not in stopped.content[0].text
    # As Anthropic does: the sequence that ended the answer is named.
    assert stopped.stop_sequence == ("the" if stopped.stop_reason == "stop_sequence" else None)
    with client.messages.stream(
        model="claude-sim", max_tokens=200, stop_sequences=["e"], messages=[{"role": "user", "content": "x"}]
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "e")


def test_stream_events(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and final.content[0].text and final.usage.output_tokens > 0


def test_tool_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "define harbor"}]
    call = client.messages.create(model="claude-sim", max_tokens=64, tools=[TOOL], messages=ask)
    assert call.stop_reason == "tool_use" and call.content[0].type == "tool_use"
    result = {"type": "tool_result", "tool_use_id": call.content[0].id, "content": "a port"}
    answer = client.messages.create(
        model="claude-sim",
        max_tokens=64,
        tools=[TOOL],
        messages=[
            *ask,
            {"role": "assistant", "content": call.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"


def test_count_tokens(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(
        model="claude-sim", messages=[{"role": "user", "content": "x" * 400}]
    )
    assert 100 <= counted.input_tokens < 130


def test_errors_in_anthropics_shape(client: anthropic.Anthropic, sim: SimThread) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        # The SDK insists on max_tokens; null in the body stands for a client that sent none.
        client.messages.create(
            model="claude-sim",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"max_tokens": None},
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=sim.url, api_key="wrong", max_retries=0).messages.create(
            model="claude-sim", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    sim.control.add_fault("claude-sim", "error=529", count=1)
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        client.messages.create(model="claude-sim", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    sim.control.add_fault("claude-sim", "rate_limit", count=1)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model="claude-sim", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert limited.value.response.headers["retry-after"] == "1"


def test_mid_stream_faults(client: anthropic.Anthropic, sim: SimThread) -> None:
    sim.control.add_fault("claude-sim", "reset_mid_stream=2", count=1)
    # The SDK lets the transport's own error out of a stream that breaks.
    stream = client.messages.stream(
        model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": "x"}]
    )
    with pytest.raises(Exception, match=r"incomplete|closed|Connection"), stream as events:
        for _ in events:
            pass
