"""Breakpoint placement on a Messages request: where they pay, never more than 4."""

from __future__ import annotations

from typing import Any

from gateway.shaping.breakpoints import count_marks, place_breakpoints, split_stable_system


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
