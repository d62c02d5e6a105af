"""Anthropic's prompt cache, as the simulator keeps it: explicit breakpoints only.

A Messages request is read as blocks in cache order (each tool, each system block, each
message's content blocks); a block's hash names its whole prefix. Only a block that
carries ``cache_control`` is ever written, and only when its prefix reaches the minimum
cacheable length. A breakpoint reads the longest cached prefix ending at it or at one of
the 20 blocks before it (Anthropic's look-back). Entries live 5 minutes (or 1 hour with
``"ttl": "1h"``) from their last read or write.

Usage follows the API: ``input_tokens`` is what was neither read nor written,
``cache_read_input_tokens`` the longest prefix read, ``cache_creation_input_tokens``
the tokens written beyond it (with the 5-minute/1-hour split in ``cache_creation``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from local_backend.sim._tokens import BYTES_PER_TOKEN

MIN_CACHEABLE_TOKENS = 1024
"""Below this prefix length a breakpoint writes nothing (the smallest models' minimum)."""
LOOKBACK_BLOCKS = 20
TTL_S = {"5m": 300.0, "1h": 3600.0}


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """The cache part of one request's usage (tokens)."""

    total: int
    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    @property
    def written(self) -> int:
        """Tokens written at either TTL."""
        return self.written_5m + self.written_1h

    def usage(self, output_tokens: int) -> dict[str, Any]:
        """The Messages API's ``usage`` object."""
        return {
            "input_tokens": self.total - self.read - self.written,
            "cache_creation_input_tokens": self.written,
            "cache_read_input_tokens": self.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.written_5m,
                "ephemeral_1h_input_tokens": self.written_1h,
            },
            "output_tokens": output_tokens,
        }


@dataclass(frozen=True, slots=True)
class _Block:
    hash: bytes
    end_tokens: int
    ttl: str | None  # the block's breakpoint TTL, None when it carries no cache_control


def _blocks(request: dict[str, Any]) -> tuple[list[_Block], bytes]:
    """Every block of ``request`` in cache order with its prefix hash, and the prompt's bytes."""
    items: list[tuple[bytes, Any]] = [(b"tool", tool) for tool in request.get("tools") or ()]
    system = request.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    items.extend((b"system", block) for block in system or ())
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        role = str(message.get("role") if isinstance(message, dict) else "").encode()
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        items.extend((role, block) for block in content or ())
    out: list[_Block] = []
    prompt = bytearray()
    parent = b""
    for label, item in items:
        mark = item.get("cache_control") if isinstance(item, dict) else None
        plain = {k: v for k, v in item.items() if k != "cache_control"} if isinstance(item, dict) else item
        data = label + b":" + orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
        prompt += data
        parent = hashlib.blake2b(parent + data, digest_size=16).digest()
        ttl = None
        if isinstance(mark, dict):
            ttl = "1h" if mark.get("ttl") == "1h" else "5m"
        out.append(_Block(parent, len(prompt) // BYTES_PER_TOKEN, ttl))
    return out, bytes(prompt)


MAX_BREAKPOINTS = 4


def _mark_ttls(request: dict[str, Any]) -> list[str]:
    """The TTL of every ``cache_control`` mark, in Anthropic's order (tools, system, messages;
    a tool result's own blocks before the result)."""
    ttls: list[str] = []

    def visit(block: Any) -> None:
        if not isinstance(block, dict):
            return
        inner = block.get("content") if block.get("type") == "tool_result" else None
        for nested in inner if isinstance(inner, list) else ():
            visit(nested)
        mark = block.get("cache_control")
        if isinstance(mark, dict):
            ttls.append("1h" if mark.get("ttl") == "1h" else "5m")

    for tool in request.get("tools") or ():
        visit(tool)
    system = request.get("system")
    for block in system if isinstance(system, list) else ():
        visit(block)
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            visit(block)
    return ttls


def breakpoint_problem(request: dict[str, Any]) -> str | None:
    """Anthropic's 400 message for a request's ``cache_control`` marks (more than 4, or a
    1-hour mark after a 5-minute one), None when they are valid."""
    ttls = _mark_ttls(request)
    if len(ttls) > MAX_BREAKPOINTS:
        return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(ttls)}."
    if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
        return (
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
            "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
        )
    return None


def prompt_bytes(request: dict[str, Any]) -> bytes:
    """The bytes a request's tokens are counted from (and its answer seeded by)."""
    return _blocks(request)[1]


class MessagesCache:
    """One model's cache entries: prefix hash -> expiry time."""

    def __init__(self, min_tokens: int = MIN_CACHEABLE_TOKENS) -> None:
        self.min_tokens = min_tokens
        self._entries: dict[bytes, tuple[float, float]] = {}  # hash -> (expires_at, ttl_s)

    def __len__(self) -> int:
        return len(self._entries)

    def _alive(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry[0] <= now:
            del self._entries[key]
            return False
        return True

    def lookup_and_write(self, request: dict[str, Any], now: float) -> CacheUsage:
        """Read the longest cached prefix at the request's breakpoints; write the rest."""
        blocks, prompt = _blocks(request)
        total = max(1, -(-len(prompt) // BYTES_PER_TOKEN))
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None]
        read, hit = 0, -1
        for i in marks:
            for j in range(i, max(-1, i - LOOKBACK_BLOCKS - 1), -1):
                if self._alive(blocks[j].hash, now):
                    if blocks[j].end_tokens > read:
                        read, hit = blocks[j].end_tokens, j
                    break
        if hit >= 0:  # a read refreshes the entry's TTL
            _, ttl_s = self._entries[blocks[hit].hash]
            self._entries[blocks[hit].hash] = (now + ttl_s, ttl_s)
        written = {"5m": 0, "1h": 0}
        upto = read
        for i in marks:
            block = blocks[i]
            if block.end_tokens < self.min_tokens or block.end_tokens <= read or block.ttl is None:
                continue
            ttl_s = TTL_S[block.ttl]
            self._entries[block.hash] = (now + ttl_s, ttl_s)
            if block.end_tokens > upto:
                written[block.ttl] += block.end_tokens - upto
                upto = block.end_tokens
        return CacheUsage(total, read, written["5m"], written["1h"])

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
