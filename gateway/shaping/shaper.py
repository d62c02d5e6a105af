"""Prompt shaping: stable content first, volatile content last, nothing that means something moved.

The unit of the system prompt is the line (the content part, for array content: a text
part moves whole, other parts never move). The head system (or developer) message's
volatile lines — found by the detectors or by the
learned stability model — move, in their order, to the end of that message
(``end_of_system``) or into a system message just before the newest user turn
(``before_last_user``: the system prompt *and* the conversation history then stay a
common prefix from one turn to the next). Marked retrieval context moves as one block
after the instructions. Tools are sorted by name; JSON is serialized with sorted keys.
Conversation turns never change order, no line changes its bytes, and shaping a shaped
request changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not, ne, not_
from typing import Any, NamedTuple

import orjson

from gateway.shaping.canonical import canonical_wrapper
from gateway.shaping.heads import Head, HeadReader
from gateway.shaping.placement import Placements
from gateway.shaping.policy import Placement, ShapingPolicy
from gateway.shaping.stability import StabilityModel
from gateway.shaping.units import (
    ELEMENT,
    FENCE,
    ITEM,
    LEAD_IN,
    LINES,
    SECTION,
    Unit,
    glued,
    level,
    line_kind,
    segment_cached,
)
from gateway.shaping.volatile import Detectors, line_hash
from gateway.store.writer import StatsWriter

_HEAD_ROLES = ("system", "developer")
_NOT_TEXT = (False, "", "")
_SIGNED_FIRST = 20
_SIGN_EVERY = 10
_FIRST_USERS_KEPT = 8  # first user messages whose hash is remembered (conversations under way)
# Conversations whose last request's head is kept (with its stable text: as many as the
# head reader keeps heads, gateway.shaping.heads).
_REPLAYS_KEPT = 512
_REPLAY_MAX_CHANGED = 16  # more units changed than this: decide afresh
_STABLE_KEPT = 256  # templates whose last stable head is kept
_STABLE_MAX_CHARS = 1 << 17  # a longer stable head is not kept (memory)
_PREFIX_HASHES_KEPT = 256
_SIGNED_KEPT = 64  # templates whose last signed head is kept (its lines and segments)
_LONG_NUMBER = re.compile(r"\d{16}")


@dataclass(slots=True)
class ShapeResult:
    """What shaping did to one request."""

    template: str = "-"
    moved: int = 0
    rag_moved: bool = False
    moved_before_user: int = 0
    """Of the moved units, those that went into a system message of their own later in the
    conversation (they change within it): before the newest user turn, or after the last tool
    result (``late_at``); the others went to the end of the system message."""
    late_at: str = "user"
    """Where that message went: ``user`` (before the newest user turn), ``tool`` (after the last
    tool result of the agent step under way) or ``turn`` (after the user's newest message)."""
    moves: list[tuple[str, str, str]] = field(default_factory=list)
    """Per moved unit (the retrieval block included): what it is (``line``, ``list``,
    ``section``, ``<env>``, ``code block``, ``part``, ``retrieved``), why it moved (see
    :data:`REASONS`) and where to (``end``, ``user``, ``tool``, ``instructions``) — for the
    cache stats, which keep it per request."""
    tools_sorted: bool = False
    stable_prefix_tokens: int = 0
    head_stable_chars: int = 0
    """How much of the head system message (after shaping) is the stable part (string content)."""
    head_stable_parts: int = 0
    """How many of the head system message's parts (after shaping) are stable (array content)."""
    prefix_hash: str = ""
    """Hash of the tools and the stable head's lines: the natural ``prompt_cache_key``."""
    segments: list[tuple[str, str, str]] = field(default_factory=list)
    """The shaped prompt's segments, in order: (label, hash, preview) — for the divergence report."""

    def header(self) -> str:
        """The ``x-switchyard-shaping`` value."""
        parts = [f"moved={self.moved}"]
        if self.rag_moved:
            parts.append("rag=moved")
        if self.tools_sorted:
            parts.append("tools=sorted")
        parts.append(f"stable_prefix_tokens={self.stable_prefix_tokens}")
        parts.append(f"template={self.template}")
        if self.moved:
            parts.append(
                f"to=end:{self.moved - self.moved_before_user},{self.late_at}:{self.moved_before_user}"
            )
        return "; ".join(parts)


REASONS = {
    "changes within the conversation": "it differed in the conversation's previous request",
    "same within the conversation": "volatile across conversations, constant within this one",
    "first turn": "volatile; no history yet to keep cached ahead of it",
    "placement": "volatile; the deployments it may reach take system text only at the top",
    "retrieved": "the retrieval block, after the instructions",
    "retrieved anew": "passages new in this conversation's request",
}
"""The reasons a unit moved, as :attr:`ShapeResult.moves` gives them, and what each means."""


def _unit_kind(unit: Unit, lines: list[str]) -> str:
    """What a unit is, in a word (for the per-request record of moves)."""
    if unit.kind == ELEMENT:
        return f"<{unit.tag}>" if unit.tag else "element"
    if unit.kind == FENCE:
        return "code block"
    if unit.kind == SECTION:
        return "section"
    if unit.end - unit.start == 1:
        return "line"
    return "list" if any(line_kind(line) == ITEM for line in lines[unit.start : unit.end]) else "lines"


class _Layout(NamedTuple):
    """A conversation's last request's head: the hashes of the units that moved, and of those
    that stayed (concatenated, 8 characters each: a string costs less than a set). A tuple:
    one is made per request, and a frozen dataclass costs a call per field."""

    moved: frozenset[str]
    stable: str


@dataclass(frozen=True, slots=True)
class _ShapedTools:
    """A request's tools as shaping leaves them (see :meth:`PolicyShaper._shaped_tools`)."""

    names: str
    """Their names, sorted, comma-separated: part of the template's name."""
    tools: tuple[Any, ...]
    """In canonical form, in the policy's order (shared by the requests that carry them)."""
    sorted: bool
    """Whether sorting changed their order."""
    json: bytes
    """Their JSON with sorted keys (for the prefix hash and its token count)."""


class _Replay(NamedTuple):
    """A conversation's last request's head as :meth:`PolicyShaper._replayed` reads it: the
    layout it left, its units' hashes and which of them moved (a tuple, like :class:`_Layout`)."""

    layout: _Layout
    hashes: list[str]
    moving: list[bool]
    clean: bool
    """No hash both moved and stayed (then a hash says where its unit was)."""
    stable_idx: list[int]
    """The units that stayed (shared with the placement's memo: the same list, the same units)."""
    stable: tuple[str, str, bytes, bool]
    """Their text, hashes, hashes as bytes and whether any is not blank."""


_Placed = tuple[list[int], list[int], list[int], int, list[bool]]
"""What :meth:`PolicyShaper._placed` decides: (order, end_idx, late_idx, rag, moving)."""


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        function = tool.get("function")
        if isinstance(function, dict):
            return str(function.get("name", ""))
        return str(tool.get("name", ""))
    return ""


def _canonical_arguments(messages: list[Any]) -> None:
    """Tool-call arguments (JSON inside a string) re-serialized with sorted keys."""
    for message in messages:
        if not isinstance(message, dict) or not message.get("tool_calls"):
            continue
        for call in message["tool_calls"]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
                continue
            if _LONG_NUMBER.search(function["arguments"]):
                continue  # a double could not hold it exactly: the bytes stay as they are
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(function["arguments"])
                function["arguments"] = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()


def _part_text(part: Any) -> str | None:
    """The text of a text content part; None for any other part (an image never moves)."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    return None


def _texts(content: str | list[Any]) -> list[str | None]:
    """The head's units as text: its lines, or its parts' texts (None for a non-text part)."""
    if isinstance(content, str):
        return list(content.split("\n"))  # list[str] is not a list[str | None]
    return [_part_text(part) for part in content]


def _short(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"


class PolicyShaper:
    """The shaping one policy asks for, its detectors compiled once (a loaded policy's snapshot
    holds one). What shaping learns across requests and policies lives in
    :class:`~gateway.shaping.service.ShapingState`."""

    def __init__(self, policy: ShapingPolicy, placements: Placements | None = None) -> None:
        self.policy = policy
        self.placements = placements if placements is not None else Placements.everywhere(policy.placement)
        self.detectors = Detectors(policy.detectors, policy.volatile_patterns)
        self._canonical_memo: dict[bytes, Any] = {}
        self._tools_memo: dict[bytes, _ShapedTools] = {}
        self._conversations: dict[str, _Layout] = {}  # per conversation, its last request's head
        self._first_users: list[tuple[str, str]] = []  # recent first user messages and their hashes
        self._seen: dict[str, int] = {}  # requests per template, for sampling signatures
        # What a head's text reads as depends on the text alone; it is read against the last
        # head of its template's shape, at the cost of what changed (gateway.shaping.heads).
        self._reader = HeadReader(self.detectors, policy.rag.markers if policy.rag.enabled else None)
        self._whole: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[list[Unit], bool]] = {}
        self._placements: dict[tuple[int, bytes, bytes, int, int], tuple[list[Unit], _Placed]] = {}
        # Per conversation, its last request's head (read against it, see _replayed).
        self._replays: dict[str, _Replay] = {}
        # Per template, its last head's stable units (their strings) and what they join to.
        self._stable_memo: dict[str, tuple[list[str], list[str], tuple[str, str, bytes, bool]]] = {}
        # Per template, the last head signed: its text, lines, segment per line and segments.
        self._signed_heads: dict[
            str, tuple[str, list[str], list[tuple[str, str, str] | None], list[tuple[str, str, str]]]
        ] = {}
        # The prefix hash of the last few (tools JSON, stable head) pairs: a template's requests
        # repeat theirs, as the very same bytes objects (memoized above), hashes cached.
        self._prefix_hashes: dict[tuple[bytes, bytes], str] = {}

    def _canonical(self, obj: Any) -> Any:
        """A tool or response format in canonical form (:mod:`gateway.shaping.canonical`;
        memoized: tool lists repeat)."""
        raw = orjson.dumps(obj)
        found = self._canonical_memo.get(raw)
        if found is None:
            found = orjson.loads(orjson.dumps(canonical_wrapper(obj)))
            if len(self._canonical_memo) > 4096:
                self._canonical_memo.clear()
            self._canonical_memo[raw] = found
        return found

    def _shaped_tools(self, tools: list[Any]) -> _ShapedTools:
        """A tool list in canonical form, sorted as the policy asks, with its names and JSON
        (memoized by its bytes: a template's requests carry the same tools)."""
        raw = orjson.dumps(tools)
        found = self._tools_memo.get(raw)
        if found is not None:
            return found
        names = ",".join(sorted(_tool_name(t) for t in tools))
        out = [self._canonical(tool) for tool in tools]
        ordered = sorted(out, key=_tool_name) if self.policy.sort_tools and out else out
        found = _ShapedTools(
            names, tuple(ordered), ordered != out, orjson.dumps(ordered, option=orjson.OPT_SORT_KEYS)
        )
        if len(self._tools_memo) > 1024:
            self._tools_memo.clear()
        self._tools_memo[raw] = found
        return found

    def shape(
        self,
        body: dict[str, Any],
        stability: StabilityModel | None = None,
        writer: StatsWriter | None = None,
        template: str | None = None,
    ) -> ShapeResult:
        """Reorder ``body`` in place (a chat completion request) and say what moved.

        ``template`` names the request's template explicitly; otherwise it is the hash of its
        tool names and its longest system line, masked (the instructions, typically: a user's
        name or the date does not change it; a template whose longest line varies is named
        by the client, ``x-switchyard-template``)."""
        policy = self.policy
        result = ShapeResult()
        messages = body.get("messages")
        if not isinstance(messages, list):
            return result
        tools = body.get("tools")
        shaped_tools = (
            self._shaped_tools(tools)
            if policy.enabled and policy.canonical_json and isinstance(tools, list)
            else None
        )
        if shaped_tools is not None:
            tool_names = shaped_tools.names
        else:
            # Sorted: a template does not change with the order its tools come in.
            tool_names = ",".join(sorted(_tool_name(t) for t in tools)) if isinstance(tools, list) else ""
        head = messages[0] if messages and isinstance(messages[0], dict) else None
        if (
            head is None
            or head.get("role") not in _HEAD_ROLES
            or not isinstance(head.get("content"), (str, list))
        ):
            head = None
            result.template = template or (line_hash(tool_names) if tool_names else "-")
        if not policy.enabled:
            # Nothing changes; the template and its segments are still read, for the cache report.
            if head is not None:
                result.template = template or self._reader.template(
                    [t for t in _texts(head["content"]) if t is not None], tool_names
                )
            self._signature(body, result)
            return result
        if shaped_tools is not None:
            if shaped_tools.tools:
                body["tools"] = tools = list(shaped_tools.tools)
                result.tools_sorted = shaped_tools.sorted
        elif isinstance(tools, list) and tools:
            if policy.canonical_json:
                body["tools"] = tools = [self._canonical(tool) for tool in tools]
            if policy.sort_tools:
                ordered = sorted(tools, key=_tool_name)
                result.tools_sorted = ordered != tools
                body["tools"] = tools = ordered
        if policy.canonical_arguments:
            _canonical_arguments(messages)
        if policy.canonical_json:
            fmt = body.get("response_format")
            if isinstance(fmt, dict):
                body["response_format"] = self._canonical(fmt)
        stable_head = b""
        if head is not None:
            at = _late_index(messages, self.placements(body.get("model")))
            stable_head = self._shape_head(
                messages, head, tool_names, result, stability, writer, template, at
            )
        if shaped_tools is not None:
            tools_json = shaped_tools.json
        else:
            tools_json = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if isinstance(tools, list) else b""
        result.stable_prefix_tokens += len(tools_json) // 4
        result.prefix_hash = self._prefix_hash(tools_json, stable_head)
        self._signature(body, result)
        return result

    def _prefix_hash(self, tools_json: bytes, stable_head: bytes) -> str:
        """The hash of the tools and the stable head (memoized: a template's requests repeat it)."""
        key = (tools_json, stable_head)
        found = self._prefix_hashes.get(key)
        if found is None:
            found = hashlib.blake2b(tools_json + stable_head, digest_size=8).hexdigest()
            if len(self._prefix_hashes) >= _PREFIX_HASHES_KEPT:
                del self._prefix_hashes[next(iter(self._prefix_hashes))]  # the oldest
            self._prefix_hashes[key] = found
        return found

    def _shape_head(
        self,
        messages: list[Any],
        head: dict[str, Any],
        tool_names: str,
        result: ShapeResult,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        template: str | None,
        at: int,
    ) -> bytes:
        """Shape the head message; the hashes of its stable units (for the prefix hash). ``at``:
        where a system message of per-request content goes (-1: nowhere, see :func:`_late_index`)."""
        content: str | list[Any] = head["content"]
        if isinstance(content, str):
            return self._shape_text(
                messages, head, content, tool_names, result, stability, writer, template, at
            )
        detect = self.detectors.line
        texts = _texts(content)
        lines = [t for t in texts if t is not None]
        detected = [detect(t) if t is not None else _NOT_TEXT for t in texts]
        # A non-text part is counted by its JSON (another image is another part).
        hashes = [
            h if t is not None else line_hash(orjson.dumps(u).decode())
            for t, u, (_, _, h) in zip(texts, content, detected, strict=True)
        ]
        result.template = template or self._reader.template(lines, tool_names)
        moving = self._moving(result.template, texts, [d[0] for d in detected], hashes, stability, writer)
        volatile = [u for u, m in zip(content, moving, strict=True) if m]
        stable = [u for u, m in zip(content, moving, strict=True) if not m]
        kept = [t for t, m in zip(texts, moving, strict=True) if not m]
        stable_key = "".join([h for h, m in zip(hashes, moving, strict=True) if not m]).encode()
        has_stable = any(t is None or t.strip() for t in kept)
        result.stable_prefix_tokens = sum(len(t) for t in kept if t is not None) // 4
        if not has_stable or not volatile:
            if has_stable:
                result.head_stable_parts = len(content)
            return stable_key if has_stable else b""
        result.moved = len(volatile)
        result.head_stable_parts = len(stable)
        if at > 0:
            head["content"] = stable
            messages.insert(at, {"role": head["role"], "content": volatile})
            result.moved_before_user = len(volatile)
            result.late_at = _late_at(messages, at)
            result.moves = [("part", "changes within the conversation", result.late_at)] * len(volatile)
        else:
            shaped = [*stable, *volatile]
            if shaped == content:  # already stable first, volatile last: a shaped request
                result.moved = 0
            else:
                result.moves = [("part", "placement" if at < 0 else "first turn", "end")] * len(volatile)
            head["content"] = shaped
        return stable_key

    def _moving(
        self,
        template: str,
        texts: Sequence[str | None],
        detected: list[bool],
        hashes: list[str],
        stability: StabilityModel | None,
        writer: StatsWriter | None,
    ) -> list[bool]:
        """Per unit, whether it is volatile: a detector fires, or the counts of its template
        say it varies; blank units and non-text parts carry nothing that varies: they stay."""
        policy = self.policy
        if stability is None or not policy.learn:
            return list(detected)  # a copy: the caller changes it, the head's list is shared
        learned = stability.verdicts(template, hashes, policy.learn_min_requests, policy.stable_share)
        stability.observe(template, hashes, writer)
        if not learned or learned[0] is None:  # not known yet: for all of them, or none
            return list(detected)
        moving = list(map(not_, learned))
        for i in list(compress(range(len(moving)), moving)):  # the few the counts find volatile
            text = texts[i]
            moving[i] = text is not None and bool(text.strip())
        return moving

    def _shape_text(
        self,
        messages: list[Any],
        head: dict[str, Any],
        content: str,
        tool_names: str,
        result: ShapeResult,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        template: str | None,
        at: int,
    ) -> bytes:
        """Shape a string head by its self-contained units (:mod:`gateway.shaping.units`)."""
        read = self._reader.read(content, tool_names)
        lines, units, texts, _, hashes, rag, rag_hash, skeleton, ambiguous, rag_blocks = read
        result.template = template or skeleton
        key, previous = self._layout(messages, result.template)
        replayed = (
            self._replayed(key, previous, result.template, read, stability, writer, messages, at)
            if previous is not None and rag < 0 and not ambiguous and not rag_blocks
            else None
        )
        if replayed is not None:
            replay, changed, moving, late = replayed
            order, end_idx, late_idx, rag, moving = self._placed(units, lines, texts, moving, late, -1, -1)
        else:
            replay, changed = None, []
            order, end_idx, late_idx, rag, moving = self._decided(
                read, result.template, key, previous, stability, writer, messages, at
            )
        # The units that stay, in their order (``order`` is exactly those, and the block).
        stable_idx = order if rag < 0 else [i for i in order if i != rag]
        if replay is not None and stable_idx is replay.stable_idx and all(map(moving.__getitem__, changed)):
            # The same units stay as in the conversation's previous request, none of them read
            # again (every unit that changed moves): their text is the one joined then.
            stable = replay.stable
        else:
            stable = self._stable(result.template, stable_idx, texts, hashes)
        stable_text, stable_hashes, stable_key, has_stable = stable
        if key:
            # The retrieval block, wherever it stays, is known by its element lines.
            kept_rag = read.rag >= 0 and not moving[read.rag]
            layout = self._remember(key, hashes, moving, stable_hashes + (rag_hash if kept_rag else ""))
            if read.rag < 0 and not ambiguous and not rag_blocks:
                self._keep_replay(key, layout, hashes, moving, stable_idx, stable)
        result.stable_prefix_tokens = len(stable_text) // 4
        if not has_stable or (not end_idx and not late_idx and rag < 0):
            # Nothing volatile, or nothing but: either way nothing to gain by moving.
            if has_stable:
                result.head_stable_chars = len(content)
            return stable_key if has_stable else b""
        before_rag = "\n".join([texts[i] for i in order[: order.index(rag)]]) if rag >= 0 else stable_text
        result.head_stable_chars = len(before_rag.rstrip("\n"))
        if rag < 0 and stable_idx:
            # ``order`` is the stable units: the shaped text starts with the text just joined.
            shaped = "\n".join([stable_text, *map(texts.__getitem__, end_idx)])
        else:
            shaped = "\n".join(map(texts.__getitem__, (*order, *end_idx)))
        if shaped == content and not late_idx:  # already stable first, volatile last: a shaped request
            return stable_key
        result.moved = len(end_idx) + len(late_idx)
        result.moved_before_user = len(late_idx)
        result.rag_moved = rag >= 0 and order != sorted(order)
        head["content"] = shaped
        if late_idx:
            messages.insert(at, {"role": head["role"], "content": "\n".join(texts[i] for i in late_idx)})
            result.late_at = _late_at(messages, at)
        result.moves = self._moves(messages, at, units, lines, read.rag, end_idx, late_idx, result)
        return stable_key

    def _decided(
        self,
        read: Head,
        template: str,
        key: str,
        previous: _Layout | None,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        messages: list[Any],
        at: int,
    ) -> _Placed:
        """Where each unit of the head goes (see :meth:`_placed`): its verdict, the layout the
        conversation had, the retrieval block and the placement."""
        lines, units, texts, detected, hashes, rag, rag_hash, _, ambiguous, rag_blocks = read
        moving = self._moving(template, texts, detected, hashes, stability, writer)
        if previous is not None:
            # Within a conversation a unit keeps the place it had: a verdict that changes as the
            # model learns must not change the prefix of a conversation under way.
            moved, stable_before = previous.moved, previous.stable
            if moved:  # the units carrying a hash that moved: one C-speed pass
                for i in compress(range(len(hashes)), map(moved.__contains__, hashes)):
                    moving[i] = True
            for i in list(compress(range(len(moving)), moving)):  # the few moving units
                h = hashes[i]
                if h not in moved and _has_hash(stable_before, h):
                    moving[i] = False
        if ambiguous:
            moving, rag = [False] * len(units), -1
        for i in rag_blocks:
            moving[i] = False
        rag_kept = rag  # the retrieval block, wherever it goes below
        to_end = at < 0
        if rag >= 0:
            moving[rag] = False
            if (
                not to_end
                and previous is not None
                and hashes[rag] not in previous.moved
                and not _has_hash(previous.stable, rag_hash)
            ):
                # Passages retrieved anew for this turn: before the newest user turn, whole, like
                # any content that changes within the conversation (the history stays cached).
                moving[rag], rag = True, -1
        late = self._late(messages, at, previous, hashes, moving, detected)
        return self._placed(units, lines, texts, moving, late, rag, rag_kept)

    def _replayed(
        self,
        key: str,
        previous: _Layout,
        template: str,
        read: Head,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        messages: list[Any],
        at: int,
    ) -> tuple[_Replay, list[int], list[bool], list[bool]] | None:
        """What :meth:`_decided` would find moving and late, at the cost of what changed since
        the conversation's previous request (None: decide afresh); also that request's
        replay and the units that changed since.

        Within a conversation a unit whose hash the previous request had keeps the place it
        had there, whatever its verdict: it moved (its hash is in the layout's moved set) and
        moves again, to the end of the system message, or it stayed (its hash is in the
        stable part) and stays. So only the units whose hash is new (by identity: a head read
        against the last one shares the strings of the units it did not read again) are
        decided; the others are the previous request's. This holds when no hash both moved
        and stayed there (``clean``) and the head has no retrieval block, nesting or
        ambiguity (checked by the caller)."""
        replay = self._replays.get(key)
        hashes = read.hashes
        if (
            replay is None
            or replay.layout is not previous
            or not replay.clean
            or len(replay.hashes) != len(hashes)
        ):
            return None
        changed = list(compress(range(len(hashes)), map(is_not, hashes, replay.hashes)))
        if len(changed) > _REPLAY_MAX_CHANGED:
            return None
        policy = self.policy
        learned: list[bool | None] | None = None
        if stability is not None and policy.learn:
            new = [hashes[i] for i in changed]
            learned = stability.verdicts(template, new, policy.learn_min_requests, policy.stable_share)
            stability.observe(template, hashes, writer)
            if learned and learned[0] is None:  # not known yet: the detectors decide
                learned = None
        moving = list(replay.moving)
        late = [False] * len(hashes)
        moved, stable_before = previous.moved, previous.stable
        # Per-request content goes late only after an answer (see :meth:`_late`).
        late_ok = at >= 0 and _has_history(messages, at)
        texts, detected = read.texts, read.detected
        for n, i in enumerate(changed):
            h = hashes[i]
            verdict = learned[n] if learned is not None else None
            # As _moving decides: the detectors until the counts are known, else the counts
            # (a blank unit carries nothing that varies).
            unit_moves = detected[i] if verdict is None else not verdict and bool(texts[i].strip())
            if h in moved:
                unit_moves = True
            elif unit_moves and _has_hash(stable_before, h):
                unit_moves = False
            moving[i] = unit_moves
            late[i] = unit_moves and late_ok and h not in moved
        return replay, changed, moving, late

    def _keep_replay(
        self,
        key: str,
        layout: _Layout,
        hashes: list[str],
        moving: list[bool],
        stable_idx: list[int],
        stable: tuple[str, str, bytes, bool],
    ) -> None:
        """Keep what :meth:`_replayed` needs for the conversation's next request."""
        replays = self._replays
        clean = layout.moved.isdisjoint(map(hashes.__getitem__, stable_idx))
        if key not in replays and len(replays) >= _REPLAYS_KEPT:
            del replays[next(iter(replays))]  # the oldest
        replays[key] = _Replay(layout, hashes, moving, clean, stable_idx, stable)

    def _stable(
        self, template: str, stable_idx: list[int], texts: list[str], hashes: list[str]
    ) -> tuple[str, str, bytes, bool]:
        """The stable units' text (joined by lines), their hashes (concatenated, and as bytes)
        and whether any of them is not blank. A template's requests mostly keep the same units
        in the head (what changed moved out): the last answer per template is kept and
        reused when the units are the very same strings (an identity compare per unit, no
        join over the whole head)."""
        unit_texts = list(map(texts.__getitem__, stable_idx))
        unit_hashes = list(map(hashes.__getitem__, stable_idx))
        memo = self._stable_memo.get(template)
        if memo is not None and memo[0] == unit_texts and memo[1] == unit_hashes:
            return memo[2]
        stable_hashes = "".join(unit_hashes)
        found = (
            "\n".join(unit_texts),
            stable_hashes,
            stable_hashes.encode(),
            any(text.strip() for text in unit_texts),
        )
        if len(found[0]) <= _STABLE_MAX_CHARS:
            if len(self._stable_memo) >= _STABLE_KEPT:
                del self._stable_memo[next(iter(self._stable_memo))]  # the oldest
            self._stable_memo[template] = (unit_texts, unit_hashes, found)
        return found

    def _placed(
        self,
        units: list[Unit],
        lines: list[str],
        texts: list[str],
        moving: list[bool],
        late: list[bool],
        rag: int,
        rag_kept: int,
    ) -> _Placed:
        """Where the units go: the order of those staying in the head, those going to its end
        (``end_idx``) and into a message of their own (``late_idx``), the retrieval block's
        index (-1: it stays where it is) and per unit whether it moves, after the checks that
        no unit reads as part of another. What it reads of the lines depends on their shapes
        alone, as :meth:`_reads_whole`'s: it is memoized by the segmentation (shared by every
        text of the same line shapes) and the verdicts, so a template's next request with the
        same verdicts reuses it (the lists given out are the memo's: not to be changed)."""
        memo_key = (id(units), bytes(moving), bytes(late), rag, rag_kept)
        memo = self._placements.get(memo_key)
        if memo is not None and memo[0] is units:
            return memo[1]
        moving = list(moving)  # _place changes it
        late_idx = list(compress(range(len(units)), late))
        if _chain_joins(units, lines, late_idx):
            late = [False] * len(units)  # they would merge in their message: to the end, or nowhere
            late_idx = []
        end = list(moving)
        for i in late_idx:
            end[i] = False
        order, rag = _place(units, lines, moving, end, rag)
        end_idx = list(compress(range(len(units)), end))
        late_idx = list(compress(range(len(units)), late))
        if (end_idx or late_idx or rag >= 0) and not self._reads_whole(
            units, texts, (*order, *end_idx), late_idx
        ):
            # Side by side in their new places, some units would read as one (an unclosed tag
            # swallowing an element, two lines joining into a sentence): only the retrieval
            # block moves, if it alone can (what a second pass would do: the volatile units
            # then keep the place they had), or nothing.
            moving = [False] * len(units)
            end_idx, late_idx = [], []
            order, rag = _place(units, lines, moving, list(moving), rag_kept)
            if rag < 0 or not self._reads_whole(units, texts, order, []):
                order, rag = list(range(len(units))), -1
        placed = (order, end_idx, late_idx, rag, moving)
        if len(self._placements) > 1024:
            self._placements.clear()
        self._placements[memo_key] = (units, placed)
        return placed

    def _moves(
        self,
        messages: list[Any],
        at: int,
        units: list[Unit],
        lines: list[str],
        rag_unit: int,
        end_idx: list[int],
        late_idx: list[int],
        result: ShapeResult,
    ) -> list[tuple[str, str, str]]:
        """What moved, why and where (see :attr:`ShapeResult.moves`)."""
        moves: list[tuple[str, str, str]] = []
        if result.rag_moved:
            moves.append(("retrieved", "retrieved", "instructions"))
        if end_idx:
            if at < 0:
                why = "placement"
            elif _has_history(messages, at):
                why = "same within the conversation"
            else:
                why = "first turn"
            moves += [(_unit_kind(units[i], lines), why, "end") for i in end_idx]
        for i in late_idx:
            if i == rag_unit:
                moves.append(("retrieved", "retrieved anew", result.late_at))
            else:
                moves.append((_unit_kind(units[i], lines), "changes within the conversation", result.late_at))
        return moves

    def _reads_whole(
        self, units: list[Unit], texts: list[str], head_order: Sequence[int], late_idx: list[int]
    ) -> bool:
        """Whether the units, in their new places (``head_order`` in the head, ``late_idx`` in a
        message of their own), are read back as the same units: shaping the shaped text then
        finds what it found in the original, and no unit reads as part of another. Memoized
        by the segmentation (``units``, shared by every text of the same line shapes: the
        answer depends on the shapes alone) and the moves."""
        memo_key = (id(units), tuple(head_order), tuple(late_idx))
        memo = self._whole.get(memo_key)
        if memo is not None and memo[0] is units:
            return memo[1]
        found = _units_kept([texts[i] for i in head_order]) and (
            not late_idx or _units_kept([texts[i] for i in late_idx])
        )
        if len(self._whole) > 1024:
            self._whole.clear()
        self._whole[memo_key] = (units, found)
        return found

    def _late(
        self,
        messages: list[Any],
        at: int,
        previous: _Layout | None,
        hashes: list[str],
        moving: list[bool],
        detected: list[bool],
    ) -> list[bool]:
        """Per unit, whether it goes into a system message at ``at`` (before the newest user
        turn, or after the last tool result) rather than to the end of the system message: only
        what changes *within* a conversation pays to go there (a per-session value there
        pushes the previous turn out of the reusable prefix).

        A unit the conversation's previous request had too is per-session (end of the system
        message); one it did not is per-request (before the newest user turn). In a
        conversation not seen before, what a detector found (a time, an id) is taken as
        per-request and what the learned model found (a name, a directory) as per-session
        (at the end of the system message it is cached for the rest of the conversation; after
        the newest turn it would be sent anew each turn)."""
        if at < 0 or not _has_history(messages, at):
            # A first turn (not yet an agent step) has no history to keep reusable: the end of
            # the system message is as good, and the next turn finds it there.
            return [False] * len(moving)
        late = [False] * len(moving)
        moved = previous.moved if previous is not None else None
        for i in compress(range(len(moving)), moving):
            late[i] = detected[i] if moved is None else hashes[i] not in moved
        return late

    def _layout(self, messages: list[Any], template: str) -> tuple[str, _Layout | None]:
        """The conversation's key (its template and first user message) and what its previous
        request's head looked like."""
        key = self._conversation_key(messages, template)
        return key, (self._conversations.get(key) if key else None)

    def _conversation_key(self, messages: list[Any], template: str) -> str:
        """A conversation's key: its template and first user message ("" when it has none). The
        first user message is often long (a pasted file, a document) and the same from one
        request of a conversation to the next: its hash is remembered for the last few (a
        string compare instead of a hash over all of it)."""
        raw = _first_user(messages)
        if raw is None:
            return ""
        memo = self._first_users
        for i, (seen, h) in enumerate(memo):
            if seen == raw:
                if i:
                    memo.insert(0, memo.pop(i))
                return f"{template}:{h}"
        h = line_hash(raw)
        memo.insert(0, (raw, h))
        del memo[_FIRST_USERS_KEPT:]
        return f"{template}:{h}"

    def _remember(self, key: str, hashes: list[str], moving: list[bool], stable: str) -> _Layout:
        if len(self._conversations) > 5_000:
            self._conversations.clear()
        layout = self._conversations[key] = _Layout(frozenset(compress(hashes, moving)), stable)
        return layout

    def _signature(self, body: dict[str, Any], result: ShapeResult) -> None:
        """The segments of the first requests of a template, then of every tenth (the
        divergence report reads the last 20 kept: a sample is enough, and it costs)."""
        seen = self._seen
        n = seen.get(result.template, 0)
        if len(seen) > 20_000:
            seen.clear()
        seen[result.template] = n + 1
        if n >= _SIGNED_FIRST and n % _SIGN_EVERY:
            return
        previews = self.policy.report_previews
        segments = result.segments
        tools = body.get("tools")
        if isinstance(tools, list) and tools:
            data = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
            segments.append(
                ("tools", _short(data), ",".join(_tool_name(t) for t in tools)[:80] if previews else "")
            )
        for i, message in enumerate(body.get("messages") or ()):
            if not isinstance(message, dict):
                continue
            role = str(message.get("role", ""))
            content = message.get("content")
            if i == 0 and role in _HEAD_ROLES and isinstance(content, str):
                segments += self._head_signature(result.template, content)
                continue
            if i == 0 and role in _HEAD_ROLES and isinstance(content, list):
                for n, piece in enumerate(content):
                    text = _part_text(piece)
                    if text is None:
                        segments.append((f"system part {n + 1}", _short(orjson.dumps(piece)), ""))
                    else:
                        segment = self._line_segment("part", n, text)
                        if segment is not None:
                            segments.append(segment)
                continue
            data = orjson.dumps(content)
            preview = (
                self.detectors.line(str(content)[:200])[1][:80]
                if previews and isinstance(content, str)
                else ""
            )
            segments.append((f"message {i + 1} ({role})", _short(data), preview))

    def _line_segment(self, unit: str, n: int, text: str) -> tuple[str, str, str] | None:
        """The segment of the head's line (or text part) ``n``; None for a blank one."""
        if not text.strip():
            return None
        _, masked, h = self.detectors.line(text)
        return (f"system {unit} {n + 1}", h, masked[:80] if self.policy.report_previews else "")

    def _head_signature(self, template: str, content: str) -> list[tuple[str, str, str]]:
        """The segments of a string head, line by line. The last one signed per template is
        kept: a repeat costs a compare, and a head with the same number of lines costs the
        lines that differ (a shaped head mostly repeats: what varies moved out of it)."""
        memo = self._signed_heads.get(template)
        if memo is not None and memo[0] == content:
            return memo[3]
        lines = content.split("\n")
        line_segment = self._line_segment
        if memo is not None and len(memo[1]) == len(lines):
            per_line = list(memo[2])
            for n in compress(range(len(lines)), map(ne, lines, memo[1])):
                per_line[n] = line_segment("line", n, lines[n])
        else:
            per_line = [line_segment("line", n, line) for n, line in enumerate(lines)]
        found = list(filter(None, per_line))
        if len(content) <= _STABLE_MAX_CHARS:
            if len(self._signed_heads) >= _SIGNED_KEPT:
                del self._signed_heads[next(iter(self._signed_heads))]  # the oldest
            self._signed_heads[template] = (content, lines, per_line, found)
        return found


def _late_at(messages: list[Any], at: int) -> str:
    """Where the system message inserted at ``at`` went: ``user`` (before the newest user
    turn), ``tool`` (after an agent step's last tool result) or ``turn`` (after the user's
    newest message)."""
    if at < len(messages) - 1:
        return "user"
    before = messages[at - 1]
    return "tool" if isinstance(before, dict) and before.get("role") == "tool" else "turn"


def _has_history(messages: list[Any], at: int) -> bool:
    """Whether an answer (an assistant turn) comes before position ``at``."""
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages[1:at])


def _late_index(messages: list[Any], placement: Placement) -> int:
    """Where a system message of per-request content goes (-1: nowhere; it stays in the system
    message): after the newest turn (``after_last_turn``: the user's message or an agent
    step's last tool result), after the last tool result only (``after_last_tool``), or
    before the newest user turn. The later, the more of the conversation before it (the
    previous turn, the step's calls and results) stays a reusable prefix."""
    if placement == "end_of_system":
        return -1
    last_user = _last_user_index(messages)
    if last_user <= 0:
        return -1
    last = messages[-1]
    role = last.get("role") if isinstance(last, dict) else None
    if role == "tool" and placement in ("after_last_tool", "after_last_turn"):
        return len(messages)
    if role == "user" and placement == "after_last_turn":
        return len(messages)
    return last_user


def _last_user_index(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, 0, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            return i
    return -1


def _has_hash(joined: str, h: str) -> bool:
    """Whether ``h`` is one of the 8-character hashes concatenated in ``joined``."""
    at = joined.find(h)
    while at >= 0:
        if at % 8 == 0:
            return True
        at = joined.find(h, at + 1)
    return False


def _first_user(messages: list[Any]) -> str | None:
    """The first user message's content as text (None when there is none)."""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else orjson.dumps(content).decode()
    return None


def _place(
    units: list[Unit], lines: list[str], moving: list[bool], end: list[bool], rag: int
) -> tuple[list[int], int]:
    """The order of the units staying in the head, and the retrieval block's index (-1 when it
    stays where it is): stable units in their order, the retrieval block right after the last
    of them that is not blank. What would land at the end of the head and read as part of the
    unit before it (after a markdown section, or glued to its last line) stays where it is:
    the retrieval block, or the units moving to the end (``moving`` and ``end`` updated)."""
    stable = list(compress(range(len(units)), map(not_, moving)))
    if rag >= 0:
        stable = [i for i in stable if i != rag]
    # Only the last one that is not blank is needed.
    last_nonblank = next(
        (n for n in range(len(stable) - 1, -1, -1) if lines[units[stable[n]].start].strip()), -1
    )
    nonblank = [last_nonblank] if last_nonblank >= 0 else []
    if (
        rag >= 0
        and nonblank
        and stable[nonblank[-1]] > rag
        and _would_join(units, lines, stable[nonblank[-1]], rag)
    ):
        return _place(units, lines, moving, end, -1)
    if any(end) and nonblank:
        before = rag if rag >= 0 else stable[nonblank[-1]]
        if _chain_joins(units, lines, [before, *compress(range(len(end)), end)]):
            for i, e in enumerate(end):
                if e:
                    moving[i] = end[i] = False
            return _place(units, lines, moving, end, rag)
    if rag < 0:
        return stable, -1
    last = nonblank[-1] if nonblank else -1
    return [*stable[: last + 1], rag, *stable[last + 1 :]], rag


def _units_kept(texts: list[str]) -> bool:
    """Whether ``texts`` (units' texts), joined line by line, segment into exactly those units."""
    lines = "\n".join(texts).split("\n")
    ends: list[int] = []
    at = 0
    for text in texts:
        at += text.count("\n") + 1
        ends.append(at)
    units, _ = segment_cached(lines)
    return [unit.end for unit in units] == ends


def _chain_joins(units: list[Unit], lines: list[str], chain: list[int]) -> bool:
    """Whether any unit of ``chain``, placed right after the one before it, would read as part of it."""
    return any(_would_join(units, lines, a, b) for a, b in itertools.pairwise(chain))


def _would_join(units: list[Unit], lines: list[str], before: int, after: int) -> bool:
    """Whether unit ``after``, placed right after unit ``before``, would read as part of it."""
    unit = units[before]
    if unit.kind == FENCE and (
        unit.end - unit.start == 1 or lines[unit.end - 1].lstrip()[:3] not in ("```", "~~~")
    ):
        return True  # a fence never closed: whatever follows would be inside it
    if units[before].kind == SECTION:
        # Anything but a section of the same level or above would read as part of it.
        if units[after].kind != SECTION:
            return True
        return level(lines[units[after].start]) > level(lines[units[before].start])
    a, b = lines[units[before].end - 1], lines[units[after].start]
    if units[before].kind == LINES and line_kind(a) == LEAD_IN:
        return True  # a lead-in line introduces whatever follows it, an element or a block too
    return (
        units[after].kind == LINES and units[before].kind == LINES and glued(a, line_kind(a), b, line_kind(b))
    )
