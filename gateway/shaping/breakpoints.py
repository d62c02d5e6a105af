"""Anthropic cache breakpoints placed from shaping's stable prefix.

Anthropic caches a prompt only up to a ``cache_control`` mark (at most 4 per request;
order tools -> system -> messages). Candidates, in order, each placed only where its
prefix reaches the model's minimum cacheable length and a slot is left after the
client's own marks (which are always kept):

1. the end of the tools (read even when the system prompt changes);
2. the end of the stable part of the system prompt (what shaping found stable);
3. in a conversation (an assistant turn before the last user turn), the end of the
   previous turn and the end of the last message: the first reads what the last request
   wrote, the second writes what the next turn will read. Blocks that shaping placed after
   the newest turn (``late_blocks``: they change by the next request) are left out of the
   second, so what it writes is a prefix the next turn sends again.

A single-turn request gets no mark on its messages: its question and documents change
with every request, and a write costs 1.25x (5 min) or 2x (1 h) the input price.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_BREAKPOINTS = 4
_BYTES_PER_TOKEN = 4  # the gateway's token estimate, as shaping uses it


def _tokens(obj: Any) -> int:
    return len(orjson.dumps(obj)) // _BYTES_PER_TOKEN


def count_marks(request: dict[str, Any]) -> int:
    """``cache_control`` marks already in a Messages request (tools, system, message blocks)."""
    found = sum(
        1 for tool in request.get("tools") or () if isinstance(tool, dict) and "cache_control" in tool
    )
    system = request.get("system")
    if isinstance(system, list):
        found += sum(1 for block in system if isinstance(block, dict) and "cache_control" in block)
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found += sum(1 for block in content if isinstance(block, dict) and "cache_control" in block)
    return found


def split_stable_system(system: list[dict[str, Any]], stable_chars: int, stable_parts: int) -> int:
    """Cut the system blocks where shaping's stable part ends; the number of leading stable
    blocks (0: none known). ``stable_chars`` counts characters of a string system prompt (one
    text block), ``stable_parts`` the leading stable parts of a list one."""
    if stable_parts:
        return min(stable_parts, len(system))
    if not stable_chars or len(system) != 1 or system[0].get("type") != "text":
        return 0
    text = system[0]["text"]
    if stable_chars < len(text):
        rest = {k: v for k, v in system[0].items() if k != "cache_control"}
        system[0] = {"type": "text", "text": text[:stable_chars]}
        system.insert(1, {**rest, "text": text[stable_chars:]})
    return 1


def _conversation_marks(messages: list[Any], late_blocks: int) -> list[tuple[int, int]]:
    """(message, block) positions of the previous turn's end and the last message's end
    (before its last ``late_blocks`` blocks)."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not any(m.get("role") == "assistant" for m in messages[: users[-1]]):
        return []
    marks = []
    previous = users[-1] - 1
    for index, skip in ((previous, 0), (len(messages) - 1, late_blocks)):
        content = messages[index].get("content")
        block = len(content) - 1 - skip if isinstance(content, list) else -1
        if block >= 0 and isinstance(content[block], dict):
            marks.append((index, block))
    return list(dict.fromkeys(marks))


def place_breakpoints(
    request: dict[str, Any],
    *,
    stable_system_blocks: int,
    min_tokens: int,
    ttl: str,
    late_blocks: int = 0,
) -> list[str]:
    """Add ``cache_control`` marks to a Messages ``request`` in place (see the module
    docstring); returns where (``tools``, ``system``, ``messages[i]``) for headers and tests.
    ``late_blocks``: trailing blocks of the last message that shaping put after the newest
    turn."""
    free = MAX_BREAKPOINTS - count_marks(request)
    if free <= 0:
        return []
    mark = {"type": "ephemeral", "ttl": ttl} if ttl != "5m" else {"type": "ephemeral"}
    placed: list[str] = []
    prefix = 0
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        prefix += _tokens(tools)
        last = tools[-1]
        if prefix >= min_tokens and isinstance(last, dict) and "cache_control" not in last:
            tools[-1] = {**last, "cache_control": mark}
            placed.append("tools")
    system = request.get("system")
    if isinstance(system, str):
        system = request["system"] = [{"type": "text", "text": system}]
    if isinstance(system, list) and stable_system_blocks and len(placed) < free:
        prefix += _tokens(system[:stable_system_blocks])
        last = system[stable_system_blocks - 1]
        if prefix >= min_tokens and "cache_control" not in last:
            system[stable_system_blocks - 1] = {**last, "cache_control": mark}
            placed.append("system")
    if isinstance(system, list):
        prefix += _tokens(system[stable_system_blocks:])
    messages = request.get("messages")
    if not isinstance(messages, list):
        return placed
    done_to = 0
    for index, block_index in _conversation_marks(messages, late_blocks):
        if len(placed) >= free:
            break
        content = messages[index]["content"]
        prefix += _tokens(messages[done_to:index]) + _tokens(content[: block_index + 1])
        done_to = index + 1
        block = content[block_index]
        if prefix >= min_tokens and "cache_control" not in block:
            content = list(content)
            content[block_index] = {**block, "cache_control": mark}
            messages[index] = {**messages[index], "content": content}
            placed.append(f"messages[{index}]")
    return placed
