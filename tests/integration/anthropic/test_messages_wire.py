"""What the anthropic SDK reads off a ``/v1/messages`` answer beyond its text, through the
gateway: ``message_start``'s input tokens, the ids, the ``request-id`` header and the stop
sequence that ended the answer (stream and not, over an Anthropic deployment and an
OpenAI-compatible one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.helpers import GatewayProcess

ASK: Any = [{"role": "user", "content": "Tell me about the harbor and its lighthouse."}]


@pytest.fixture()
def client(gateway: GatewayProcess, key: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=15) as c:
        yield c


def test_message_start_carries_the_upstreams_input_tokens(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="claude", max_tokens=64, messages=ASK) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    assert start.message.usage.input_tokens > 0
    assert start.message.usage.input_tokens == final.usage.input_tokens


@pytest.mark.parametrize("model", ["claude", "local"])
@pytest.mark.parametrize("stream", [False, True])
def test_ids_and_the_request_id_header(client: anthropic.Anthropic, model: str, stream: bool) -> None:
    if stream:
        with client.messages.stream(model=model, max_tokens=32, messages=ASK) as events:
            message = events.get_final_message()
            request_id = events.request_id
            headers = events.response.headers
    else:
        raw = client.messages.with_raw_response.create(model=model, max_tokens=32, messages=ASK)
        message, headers = raw.parse(), raw.headers
        request_id = message._request_id
    assert message.id.startswith("msg_") and not message.id.startswith("msg_msg_")
    assert request_id is not None and request_id == headers["x-request-id"]


def test_an_error_carries_the_request_id(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert info.value.request_id


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_is_reported_as_anthropic_does(client: anthropic.Anthropic, stream: bool) -> None:
    # The simulator's answers are English-like text: "e" ends them early.
    kwargs: Any = {"model": "claude", "max_tokens": 200, "stop_sequences": ["e"], "messages": ASK}
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "e")
    plain = client.messages.create(model="claude", max_tokens=200, messages=ASK)
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)


# --- cache marks: the client's TTLs and the gateway's in one order Anthropic accepts ---------
# The simulator answers a request with marks out of order (or more than 4) with Anthropic's 400.

SYSTEM = "You are a careful harbor guide who answers in one short paragraph. " * 80


def _conversation(newest: dict[str, Any]) -> list[Any]:
    return [
        {"role": "user", "content": "Where is the lighthouse?"},
        {"role": "assistant", "content": "On the north pier, past the ferry berth."},
        {"role": "user", "content": [newest]},
    ]


def test_a_clients_1h_mark_on_the_newest_message_is_accepted(client: anthropic.Anthropic) -> None:
    newest = {
        "type": "text",
        "text": "And when does it open?",
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    }
    for _ in range(2):  # the second reads what the first wrote
        message = client.messages.create(
            model="claude", max_tokens=32, system=SYSTEM, messages=_conversation(newest)
        )
    assert message.usage.cache_read_input_tokens


def test_a_1h_deployment_with_the_clients_plain_system_mark_is_accepted(
    both_sim: Any, make_gateway: Any
) -> None:
    from tests.integration.anthropic.conftest import policy

    gw = make_gateway(policy(both_sim, ", cache_ttl: 1h"))
    system: Any = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    newest = {"type": "text", "text": "And when does it open?"}
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, timeout=15) as c:
        message = c.messages.create(
            model="claude", max_tokens=32, system=system, messages=_conversation(newest)
        )
    usage = message.usage
    assert message.content and (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
