"""The simulator's Anthropic cache: nothing without a breakpoint, a minimum, a TTL, look-back."""

from __future__ import annotations

from typing import Any

from local_backend.sim._messages_cache import MessagesCache

LONG = "instructions " * 500  # ~1,600 tokens


def request(question: str, mark: dict[str, Any] | None = None, history: int = 0) -> dict[str, Any]:
    system: dict[str, Any] = {"type": "text", "text": LONG}
    if mark is not None:
        system["cache_control"] = mark
    messages: list[dict[str, Any]] = []
    for i in range(history):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    messages.append({"role": "user", "content": question})
    return {"system": [system], "messages": messages}


def test_nothing_is_cached_without_a_breakpoint() -> None:
    cache = MessagesCache()
    first = cache.lookup_and_write(request("a"), 0.0)
    second = cache.lookup_and_write(request("a"), 1.0)
    assert first.read == second.read == first.written == 0 and len(cache) == 0


def test_a_breakpoint_writes_then_reads_and_usage_adds_up() -> None:
    cache = MessagesCache()
    first = cache.lookup_and_write(request("a", {"type": "ephemeral"}), 0.0)
    assert first.read == 0 and first.written_5m > 1024
    second = cache.lookup_and_write(request("b", {"type": "ephemeral"}), 10.0)
    assert second.read == first.written and second.written == 0
    usage = second.usage(7)
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == second.total


def test_below_the_minimum_nothing_is_written() -> None:
    cache = MessagesCache(min_tokens=10_000)
    assert cache.lookup_and_write(request("a", {"type": "ephemeral"}), 0.0).written == 0


def test_entries_expire_after_their_ttl_unless_read() -> None:
    cache = MessagesCache()
    cache.lookup_and_write(request("a", {"type": "ephemeral"}), 0.0)
    assert cache.lookup_and_write(request("b", {"type": "ephemeral"}), 299.0).read > 0  # refreshed
    assert cache.lookup_and_write(request("c", {"type": "ephemeral"}), 598.0).read > 0
    assert cache.lookup_and_write(request("d", {"type": "ephemeral"}), 899.0).read == 0
    hour = MessagesCache()
    hour.lookup_and_write(request("a", {"type": "ephemeral", "ttl": "1h"}), 0.0)
    assert hour.lookup_and_write(request("b", {"type": "ephemeral"}), 3000.0).read > 0


def test_a_later_breakpoint_looks_back_for_an_earlier_write() -> None:
    cache = MessagesCache()
    first = request("q2", history=2)
    first["messages"][-1]["content"] = [
        {"type": "text", "text": "q2", "cache_control": {"type": "ephemeral"}}
    ]
    written = cache.lookup_and_write(first, 0.0).written
    second = request("q2", history=2)
    second["messages"][-1]["content"] = [{"type": "text", "text": "q2"}]
    second["messages"] += [
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": [{"type": "text", "text": "q3", "cache_control": {"type": "ephemeral"}}]},
    ]
    usage = cache.lookup_and_write(second, 5.0)
    assert usage.read == written and 0 < usage.written < 50
