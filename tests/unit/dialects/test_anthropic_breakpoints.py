"""Breakpoint placement on a Messages request: where they pay, never more than 4."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.shaping.breakpoints import count_marks, place_breakpoints, split_stable_system
from local_backend.sim._messages_cache import breakpoint_problem


def request(turns: int, client_marks: int = 0, system: str = "S" * 8000) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"question {i} " * 50}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i} " * 50}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "last"}]})
    for i in range(client_marks):
        messages[i]["content"][0]["cache_control"] = {"type": "ephemeral"}
    return {
        "tools": [{"name": "t", "input_schema": {"type": "object", "description": "D" * 6000}}],
        "system": [{"type": "text", "text": system}],
        "messages": messages,
    }


def test_single_turn_marks_tools_and_system_only() -> None:
    req = request(0)
    assert place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m") == ["tools", "system"]


def test_conversation_marks_previous_turn_and_last_message() -> None:
    req = request(2)
    placed = place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="1h")
    assert placed == ["tools", "system", "messages[3]", "messages[4]"]
    assert req["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_never_more_than_four_with_the_clients_marks() -> None:
    req = request(2, client_marks=3)
    placed = place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m")
    assert placed == ["tools"] and count_marks(req) == 4


def test_nothing_below_the_minimum_cacheable_length() -> None:
    req = request(0, system="short")
    req["tools"] = [{"name": "t", "input_schema": {"type": "object"}}]
    assert place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m") == []
    assert count_marks(req) == 0


def test_stable_system_split_at_shapings_cut() -> None:
    system = [{"type": "text", "text": "stable\nvolatile"}]
    assert split_stable_system(system, 7, 0) == 1
    assert system == [{"type": "text", "text": "stable\n"}, {"type": "text", "text": "volatile"}]
    assert split_stable_system([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], 0, 1) == 1


# --- the client's TTLs: every request's marks in an order Anthropic accepts -------------------
# The oracle is the simulator's check, written from Anthropic's rules (not from this code).

ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}
FIVE_MIN = {"type": "ephemeral"}


def _mark_client(req: dict[str, Any], where: str, mark: dict[str, str]) -> None:
    if where == "tools":
        req["tools"][0]["cache_control"] = mark
    elif where == "system":
        req["system"][0]["cache_control"] = mark
    elif where == "first":
        req["messages"][0]["content"][0]["cache_control"] = mark
    elif where == "newest":
        req["messages"][-1]["content"][0]["cache_control"] = mark


def test_a_clients_1h_mark_on_the_newest_message_makes_the_gateways_earlier_marks_1h() -> None:
    req = request(2)
    _mark_client(req, "newest", ONE_HOUR)
    placed = place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m")
    assert placed == ["tools", "system", "messages[3]"]
    assert req["tools"][0]["cache_control"] == ONE_HOUR and req["system"][0]["cache_control"] == ONE_HOUR
    assert breakpoint_problem(req) is None


def test_a_1h_deployment_after_a_clients_5m_system_mark_places_5m_marks() -> None:
    req = request(2)
    _mark_client(req, "system", FIVE_MIN)
    placed = place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="1h")
    # The tools come before the client's 5-minute mark: 1 hour there is allowed.
    assert req["tools"][0]["cache_control"] == ONE_HOUR
    assert placed == ["tools", "messages[3]", "messages[4]"]
    assert all(req["messages"][i]["content"][0]["cache_control"] == FIVE_MIN for i in (3, 4))
    assert breakpoint_problem(req) is None


def test_between_a_clients_5m_and_1h_marks_the_gateway_places_none() -> None:
    req = request(2)
    _mark_client(req, "tools", FIVE_MIN)  # the client's own order is already invalid
    _mark_client(req, "newest", ONE_HOUR)
    assert place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m") == []


@pytest.mark.parametrize("deployment_ttl", ["5m", "1h"])
@pytest.mark.parametrize(
    "client",
    [
        {},
        {"tools": ONE_HOUR},
        {"system": FIVE_MIN},
        {"system": ONE_HOUR},
        {"first": FIVE_MIN},
        {"first": ONE_HOUR},
        {"newest": ONE_HOUR},
        {"newest": FIVE_MIN},
        {"tools": ONE_HOUR, "newest": ONE_HOUR},
        {"system": ONE_HOUR, "newest": FIVE_MIN},
        {"tools": ONE_HOUR, "system": ONE_HOUR, "first": FIVE_MIN},
    ],
)
def test_every_mix_of_ttls_stays_valid_and_at_most_four(deployment_ttl: str, client: dict[str, Any]) -> None:
    req = request(2)
    for where, mark in client.items():
        _mark_client(req, where, mark)
    place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl=deployment_ttl)
    assert breakpoint_problem(req) is None


def test_marks_inside_tool_results_count_toward_the_four() -> None:
    req = request(2)
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [
            {"type": "text", "text": "a", "cache_control": FIVE_MIN},
            {"type": "text", "text": "b", "cache_control": FIVE_MIN},
        ],
    }
    req["messages"][2]["content"].insert(0, result)
    assert count_marks(req) == 2
    place_breakpoints(req, stable_system_blocks=1, min_tokens=1024, ttl="5m")
    assert count_marks(req) == 4 and breakpoint_problem(req) is None
