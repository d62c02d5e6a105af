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

The marks stay valid with the client's: at most 4 in all (the client's own, also those
inside tool results, counted first), and every 1-hour mark before every 5-minute one (a
gateway mark takes the TTL the client's marks around it leave it, see :func:`_ttl_at`).
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_BREAKPOINTS = 4
_BYTES_PER_TOKEN = 4  # the gateway's token estimate, as shaping uses it


def _tokens(obj: Any) -> int:
    return len(orjson.dumps(obj)) // _BYTES_PER_TOKEN


_Position = tuple[int, int, int, int]
"""Where a mark sits in Anthropic's order: (tools 0 | system 1 | messages 2, item, block,
nested block of a tool result, or _WHOLE for the block itself)."""
_WHOLE = 1 << 30


def _block_marks(where: _Position, block: Any, found: list[tuple[_Position, str]]) -> None:
    if not isinstance(block, dict):
        return
    inner = block.get("content") if block.get("type") == "tool_result" else None
    for k, nested in enumerate(inner if isinstance(inner, list) else ()):
        if isinstance(nested, dict) and "cache_control" in nested:
            found.append(((*where[:3], k), _ttl_of(nested["cache_control"])))
    if "cache_control" in block:
        found.append((where, _ttl_of(block["cache_control"])))


def _ttl_of(mark: Any) -> str:
    return "1h" if isinstance(mark, dict) and mark.get("ttl") == "1h" else "5m"


def client_marks(request: dict[str, Any]) -> list[tuple[_Position, str]]:
    """The ``cache_control`` marks already in a Messages request (tools, system, message
    blocks and the blocks inside tool results: Anthropic counts them all), with their TTLs,
    in Anthropic's order."""
    found: list[tuple[_Position, str]] = []
    for i, tool in enumerate(request.get("tools") or ()):
        _block_marks((0, i, 0, _WHOLE), tool, found)
    system = request.get("system")
    for j, block in enumerate(system if isinstance(system, list) else ()):
        _block_marks((1, j, 0, _WHOLE), block, found)
    for m, message in enumerate(request.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for b, block in enumerate(content if isinstance(content, list) else ()):
            _block_marks((2, m, b, _WHOLE), block, found)
    return found


def count_marks(request: dict[str, Any]) -> int:
    """``cache_control`` marks already in a Messages request."""
    return len(client_marks(request))


def _ttl_at(where: _Position, client: list[tuple[_Position, str]], wanted: str) -> str | None:
    """The TTL a gateway mark at ``where`` may have: Anthropic takes 1-hour marks only before
    every 5-minute one. After a client's 5-minute mark it is 5 minutes, before a client's
    1-hour mark 1 hour (the client chose that TTL for the prefix), between both nothing."""
    after_5m = any(at < where and ttl == "5m" for at, ttl in client)
    before_1h = any(at > where and ttl == "1h" for at, ttl in client)
    if after_5m and before_1h:
        return None
    return "5m" if after_5m else "1h" if before_1h else wanted


def _mark(ttl: str) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": ttl} if ttl != "5m" else {"type": "ephemeral"}


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
    client = client_marks(request)
    free = MAX_BREAKPOINTS - len(client)
    if free <= 0:
        return []
    placed: list[str] = []
    prefix = 0
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        prefix += _tokens(tools)
        last = tools[-1]
        mark = _ttl_at((0, len(tools) - 1, 0, _WHOLE), client, ttl)
        if prefix >= min_tokens and isinstance(last, dict) and "cache_control" not in last and mark:
            tools[-1] = {**last, "cache_control": _mark(mark)}
            placed.append("tools")
    system = request.get("system")
    if isinstance(system, str):
        system = request["system"] = [{"type": "text", "text": system}]
    if isinstance(system, list) and stable_system_blocks and len(placed) < free:
        prefix += _tokens(system[:stable_system_blocks])
        last = system[stable_system_blocks - 1]
        mark = _ttl_at((1, stable_system_blocks - 1, 0, _WHOLE), client, ttl)
        if prefix >= min_tokens and "cache_control" not in last and mark:
            system[stable_system_blocks - 1] = {**last, "cache_control": _mark(mark)}
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
        mark = _ttl_at((2, index, block_index, _WHOLE), client, ttl)
        if prefix >= min_tokens and "cache_control" not in block and mark:
            content = list(content)
            content[block_index] = {**block, "cache_control": _mark(mark)}
            messages[index] = {**messages[index], "content": content}
            placed.append(f"messages[{index}]")
    return placed
