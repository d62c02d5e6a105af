"""Which replica takes a request: prefix affinity by consistent hashing with bounded load.

A request's stable-prefix hash (the part of the prompt that repeats across requests:
tools and leading system messages) picks a point on a hash ring; the first replica
clockwise whose load is under the bound takes it (Mirrokni, Thorup, Zadimoghaddam,
"Consistent Hashing with Bounded Loads", 2018). The bound is
``ceil(load_factor * (total load + 1) / replicas) + load_slack``, so a hot prefix fills
its home replica up to the bound and then spills to the next replica on the ring, which
then holds that prefix's KV cache as well (the slack keeps small absolute imbalances,
where a cache miss costs more than the wait, at home). Adding or removing a replica moves only the
prefixes that hashed to it. A request without a stable prefix goes to the least-loaded
replica.

The hash is an input: prompt shaping computes the canonical stable-prefix hash and sets
:data:`PREFIX_HASH` for the request; without it, :func:`stable_prefix_hash` reads the
request body.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson

PREFIX_HASH: ContextVar[int | None] = ContextVar("switchyard_stable_prefix_hash", default=None)
"""The request's stable-prefix hash, when an earlier stage (prompt shaping) computed it."""

COMPLETION_PREFIX_BYTES = 1024  # about 256 tokens, as OpenAI routes its own prompt caches
_ROLES_BEFORE_CONVERSATION = frozenset({"system", "developer"})


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def stable_prefix_hash(body: Mapping[str, Any]) -> int | None:
    """A hash of what a request shares with others: ``prompt_cache_key`` when the client set
    one, else the tools and the leading system/developer messages (chat), or the first
    1,024 bytes of a string prompt (completions). ``None``: nothing stable to follow."""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return _h64(b"key\0" + key.encode())
    parts: list[bytes] = []
    tools = body.get("tools")
    if tools:
        parts.append(orjson.dumps(tools))
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in _ROLES_BEFORE_CONVERSATION:
                break
            parts.append(orjson.dumps(message.get("content")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            parts.append(prompt.encode()[:COMPLETION_PREFIX_BYTES])
    if not parts:
        return None
    return _h64(b"\0".join(parts))


def affinity_key(body: Mapping[str, Any]) -> int | None:
    """The hash routing follows: :data:`PREFIX_HASH` if set for this request, else the body's."""
    given = PREFIX_HASH.get()
    return given if given is not None else stable_prefix_hash(body)


class HashRing:
    """Replicas (by a stable id, e.g. their URL) placed at ``vnodes`` points each on a 64-bit ring."""

    def __init__(self, ids: Sequence[str], vnodes: int = 64) -> None:
        points = sorted(
            (_h64(f"{rid}#{v}".encode()), index) for index, rid in enumerate(ids) for v in range(vnodes)
        )
        self._positions = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self.size = len(ids)

    def walk(self, key: int) -> Iterator[int]:
        """Replica indices clockwise from ``key``'s point, each once."""
        if not self._positions:
            return
        # Re-hash the key: any int (a 32-bit hash, a small id) lands uniformly on the ring.
        point = _h64(key.to_bytes(16, "big", signed=True))
        start = bisect.bisect_left(self._positions, point)
        seen: set[int] = set()
        n = len(self._positions)
        for step in range(n):
            owner = self._owners[(start + step) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return


@dataclass(frozen=True, slots=True)
class Choice:
    """The replica chosen, and how: ``home`` (the prefix's own replica), ``spilled`` (its home
    was over the bound), or ``least_loaded`` (no prefix to follow)."""

    index: int
    how: str


def choose(
    ring: HashRing,
    loads: Sequence[float],
    eligible: Sequence[bool],
    key: int | None,
    load_factor: float,
    tie_break: int = 0,
    load_slack: float = 0.0,
) -> Choice | None:
    """The replica for a request with stable-prefix hash ``key`` (``None``: no prefix), among
    the ``eligible`` ones; ``None`` when none is eligible. ``tie_break`` rotates among
    equally loaded replicas."""
    candidates = [i for i, ok in enumerate(eligible) if ok]
    if not candidates:
        return None
    if key is not None:
        total = math.fsum(loads[i] for i in candidates) + 1.0
        bound = math.ceil(load_factor * total / len(candidates)) + load_slack
        first = True
        for index in ring.walk(key):
            if not eligible[index]:
                continue
            if loads[index] + 1.0 <= bound:
                return Choice(index, "home" if first else "spilled")
            first = False
    least = min(loads[i] for i in candidates)
    tied = [i for i in candidates if loads[i] == least]
    return Choice(tied[tie_break % len(tied)], "least_loaded")
