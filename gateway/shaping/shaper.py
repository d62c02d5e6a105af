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

This module is the orchestration (:class:`PolicyShaper`: the tools, the head, the verdicts,
the stable head and its prefix hash); the decisions it calls on are in modules of their
own: :mod:`~gateway.shaping.layout` (where the units go), :mod:`~gateway.shaping.replay`
(what a conversation's previous request decided), :mod:`~gateway.shaping.signature` (the
segment sample for the cache report), :mod:`~gateway.shaping.body` (what is read of a
request body) and :mod:`~gateway.shaping.result` (what shaping did).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

import orjson

from gateway.shaping.body import (
    _HEAD_ROLES,
    _canonical_arguments,
    _late_at,
    _late_index,
    _texts,
    _tool_name,
)
from gateway.shaping.canonical import KeyPath, canonical_wrapper, kept_orders
from gateway.shaping.decide import Decisions, _First
from gateway.shaping.heads import HeadReader
from gateway.shaping.layout import _Placed
from gateway.shaping.placement import Placements
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.replay import _Layout, _Replay
from gateway.shaping.result import REASONS, ShapeResult
from gateway.shaping.signature import _STABLE_MAX_CHARS, HeadSignatures
from gateway.shaping.stability import StabilityModel
from gateway.shaping.units import Unit
from gateway.shaping.volatile import Detectors, keep, line_hash
from gateway.store.writer import StatsWriter

_NOT_TEXT = (False, "", "")
_FIRST, _THIRD = itemgetter(0), itemgetter(2)
_STABLE_KEPT = 256  # templates whose last stable head is kept
_PREFIX_HASHES_KEPT = 256
_CANONICAL_TOOLS_KEPT = 4096
_TOOL_LISTS_KEPT = 256

__all__ = ["REASONS", "PolicyShaper", "ShapeResult"]


def _hasher(data: bytes) -> hashlib.blake2b:
    """The prefix hash's state after ``data`` (BLAKE2b, 8 bytes)."""
    return hashlib.blake2b(data, digest_size=8)


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
    hashed: hashlib.blake2b
    """The prefix hash's state after their JSON (copied per request: only the stable head
    that follows is hashed then)."""
    rendered: bytes
    """Their prompt bytes (:func:`~gateway.prompt_render.render_chat`'s, rendered once)."""


class PolicyShaper(Decisions, HeadSignatures):
    """The shaping one policy asks for, its detectors compiled once (a loaded policy's snapshot
    holds one). What shaping learns across requests and policies lives in
    :class:`~gateway.shaping.service.ShapingState`."""

    def __init__(self, policy: ShapingPolicy, placements: Placements | None = None) -> None:
        self.policy = policy
        self.placements = placements if placements is not None else Placements.everywhere(policy.placement)
        self.detectors = Detectors(policy.detectors, policy.volatile_patterns)
        self._canonical_memo: dict[bytes, Any] = {}
        self._tools_memo: dict[bytes, _ShapedTools] = {}
        # Per tool, by its JSON with sorted keys: its canonical form and where key order is kept.
        self._canonical_tools: dict[bytes, tuple[Any, list[tuple[KeyPath, tuple[str, ...]]], str]] = {}
        # Per list of canonical tools (their ids, in the policy's order): what it shapes to.
        self._tool_lists: dict[tuple[int, ...], tuple[_ShapedTools, _ShapedTools]] = {}
        # Per history (the turns a request sent), the layouts of the heads sent with it.
        self._conversations: dict[str, list[_Layout]] = {}
        self._read_hashes: list[str] = []  # the head being shaped's unit hashes
        self._seen: dict[str, int] = {}  # requests per template, for sampling signatures
        self._signed_in: dict[str, tuple[int, int]] = {}
        # What a head's text reads as depends on the text alone; it is read against the last
        # head of its template's shape, at the cost of what changed (gateway.shaping.heads).
        self._reader = HeadReader(self.detectors, policy.rag.markers if policy.rag.enabled else None)
        self._whole: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[list[Unit], bool]] = {}
        self._placements: dict[tuple[int, bytes, bytes, int, int], tuple[list[Unit], _Placed]] = {}
        # Per conversation, its last request's head (read against it, see _replayed).
        self._replays: dict[str, _Replay] = {}
        # Per template, its last first request's decision (gateway.shaping.decide).
        self._firsts: dict[str, _First] = {}
        self._kinds: dict[int, tuple[list[Unit], dict[int, str]]] = {}  # per segmentation, its units' kinds
        # Per template, its last head's stable units (their strings) and what they join to.
        self._stable_memo: dict[str, tuple[list[str], list[str], tuple[str, str, bytes, bool]]] = {}
        # Per template, the last head signed: its text, lines, segment per line and segments.
        self._signed_heads: dict[
            str, tuple[str, list[str], list[tuple[str, str, str] | None], list[tuple[str, str, str]]]
        ] = {}
        # The prefix hash of the last few (tools JSON, stable head) pairs: a template's requests
        # repeat theirs, as the very same bytes objects (memoized above), hashes cached.
        self._prefix_hashes: dict[tuple[bytes, bytes], str] = {}
        self._read_head = ("", [""])

    def _canonical(self, obj: Any) -> Any:
        """A tool or response format in canonical form (:mod:`gateway.shaping.canonical`;
        memoized: tool lists repeat)."""
        raw = orjson.dumps(obj)
        found = self._canonical_memo.get(raw)
        if found is None:
            found = canonical_wrapper(obj)  # new containers all through: shareable
            if len(self._canonical_memo) > 4096:
                self._canonical_memo.clear()
            self._canonical_memo[raw] = found
        return found

    def _canonical_tool(self, tool: Any) -> tuple[Any, list[tuple[KeyPath, tuple[str, ...]]], str]:
        """A tool in canonical form, with where its key order is kept and its name; memoized
        by its JSON with sorted keys: a client that re-serializes its tools in another key
        order each time sends a known tool (the canonical form is reused when the objects
        whose key order it keeps, such as ``properties``, come in the same order:
        :func:`~gateway.shaping.canonical.kept_orders`)."""
        key = orjson.dumps(tool, option=orjson.OPT_SORT_KEYS)
        found = self._canonical_tools.get(key)
        if found is not None:
            for path, keys in found[1]:
                node = tool
                for step in path:
                    node = node[step]  # the same JSON but for key order: the path exists
                if tuple(node) != keys:
                    break
            else:
                return found
        canonical = canonical_wrapper(tool)  # new containers all through: shareable
        found = (canonical, kept_orders(tool), _tool_name(canonical))
        return keep(self._canonical_tools, key, found, _CANONICAL_TOOLS_KEPT)

    def _shaped_tools(self, tools: list[Any], raw: bytes | None = None) -> _ShapedTools:
        """A tool list in canonical form, sorted as the policy asks, with its names and JSON
        (memoized by its bytes: a template's requests carry the same tools). ``raw``: the
        list's compact JSON when the caller has it (the size limits wrote it)."""
        if raw is None:
            raw = orjson.dumps(tools)
        found = self._tools_memo.get(raw)
        if found is not None:
            return found
        known = list(map(self._canonical_tool, tools))
        out = list(map(_FIRST, known))
        if self.policy.sort_tools and out:
            # By name, as sorted(out, key=_tool_name) (stable), the names known per tool.
            names = list(map(_THIRD, known))
            ordered = list(map(out.__getitem__, sorted(range(len(out)), key=names.__getitem__)))
        else:
            ordered = out
        # The same tools in another order or with their keys in another order: the same
        # canonical objects, so the same names, JSON, hash state and prompt bytes.
        ids = tuple(map(id, ordered))  # alive while their entry holds them: ids not reused
        shaped = self._tool_lists.get(ids)
        if shaped is None:
            names_text = ",".join(sorted(map(_tool_name, ordered)))
            data = orjson.dumps(ordered, option=orjson.OPT_SORT_KEYS)
            rendered = b"".join(map(orjson.dumps, ordered))
            as_is = _ShapedTools(names_text, tuple(ordered), False, data, _hasher(data), rendered)
            shaped = keep(self._tool_lists, ids, (as_is, replace(as_is, sorted=True)), _TOOL_LISTS_KEPT)
        found = shaped[ordered != out]
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
        tools_json: bytes | None = None,
    ) -> ShapeResult:
        """Reorder ``body`` in place (a chat completion request) and say what moved.

        ``template`` names the request's template explicitly; otherwise it is the hash of its
        tool names and its longest system line, masked (the instructions, typically: a user's
        name or the date does not change it; a template whose longest line varies is named
        by the client, ``x-switchyard-template``). ``tools_json``: the body's tool list as
        compact JSON, when the caller wrote it already (:func:`~gateway.api.protocol.check_limits`)."""
        policy = self.policy
        result = ShapeResult()
        messages = body.get("messages")
        if not isinstance(messages, list):
            return result
        tools = body.get("tools")
        shaped_tools = (
            self._shaped_tools(tools, tools_json)
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
                result.rendered_tools = shaped_tools.rendered
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
            tools_json, hashed = shaped_tools.json, shaped_tools.hashed
        else:
            tools_json = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if isinstance(tools, list) else b""
            hashed = None
        result.stable_prefix_tokens += len(tools_json) // 4
        result.stable_texts = (tools_json, *result.stable_texts)
        result.prefix_hash = self._prefix_hash(tools_json, stable_head, hashed)
        self._signature(body, result)
        return result

    def _prefix_hash(
        self, tools_json: bytes, stable_head: bytes, hashed: hashlib.blake2b | None = None
    ) -> str:
        """The hash of the tools and the stable head (memoized: a template's requests repeat it).
        ``hashed``: the hash's state after ``tools_json`` (see :class:`_ShapedTools`)."""
        key = (tools_json, stable_head)
        found = self._prefix_hashes.get(key)
        if found is None:
            state = hashed.copy() if hashed is not None else _hasher(tools_json)
            state.update(stable_head)
            found = state.hexdigest()
            keep(self._prefix_hashes, key, found, _PREFIX_HASHES_KEPT)
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
        result.stable_texts = ("\n".join([t for t in kept if t is not None]),)
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
        self._read_head = (content, lines)
        result.template = template or skeleton
        self._read_hashes = read.hashes
        keys, previous, prev_key = self._layout(messages, result.template)
        replayed = (
            self._replayed(prev_key, previous, result.template, read, stability, writer, messages, at)
            if previous is not None and rag < 0 and not ambiguous and not rag_blocks
            else None
        )
        if replayed is not None:
            replay, changed, moving, late = replayed
            order, end_idx, late_idx, rag, moving = self._placed(units, lines, texts, moving, late, -1, -1)
        else:
            replay, changed = None, []
            order, end_idx, late_idx, rag, moving = self._decided(
                read, result.template, prev_key, previous, stability, writer, messages, at
            )
        # The units that stay, in their order (``order`` is exactly those, and the block).
        stable_idx = order if rag < 0 else [i for i in order if i != rag]
        if replay is not None and stable_idx is replay.stable_idx and all(map(moving.__getitem__, changed)):
            # The same units stay as in the conversation's previous request, none of them read
            # again (every unit that changed moves): their text is the one joined then.
            stable = replay.stable
        else:
            # Every unit stays (nothing moves, as on most first turns): their text is the head's.
            whole = content if len(stable_idx) == len(texts) else None
            stable = self._stable(result.template, stable_idx, texts, hashes, whole)
        stable_text, stable_hashes, stable_key, has_stable = stable
        if keys:
            # The retrieval block, wherever it stays, is known by its element lines.
            kept_rag = read.rag >= 0 and not moving[read.rag]
            layout = self._remember(
                keys, hashes, moving, stable_hashes + (rag_hash if kept_rag else ""), previous
            )
            if read.rag < 0 and not ambiguous and not rag_blocks:
                self._keep_replay(keys, layout, hashes, moving, stable_idx, stable)
        result.stable_prefix_tokens = len(stable_text) // 4
        result.stable_texts = (stable_text,)
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
        # Blank lines that ended the text may follow a unit placed at its end: they are no move.
        result.moved = sum(1 for i in end_idx if texts[i].strip()) + len(late_idx)
        result.moved_before_user = len(late_idx)
        result.rag_moved = rag >= 0 and order != sorted(order)
        head["content"] = shaped
        if late_idx:
            messages.insert(at, {"role": head["role"], "content": "\n".join(texts[i] for i in late_idx)})
            result.late_at = _late_at(messages, at)
        result.moves = self._moves(messages, at, units, lines, read.rag, end_idx, late_idx, result)
        return stable_key

    def _stable(
        self,
        template: str,
        stable_idx: list[int],
        texts: list[str],
        hashes: list[str],
        whole: str | None = None,
    ) -> tuple[str, str, bytes, bool]:
        """The stable units' text (joined by lines), their hashes (concatenated, and as bytes)
        and whether any of them is not blank. A template's requests mostly keep the same units
        in the head (what changed moved out): the last answer per template is kept and
        reused when the units are the very same strings (an identity compare per unit, no
        join over the whole head). ``whole``: the head's text, when every unit stays
        (``stable_idx`` is all of them, in order: units are whole lines, and their texts
        joined by lines are the head's)."""
        if whole is not None:
            joined = "".join(hashes)
            return whole, joined, joined.encode(), any(map(str.strip, texts))
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
            keep(self._stable_memo, template, (unit_texts, unit_hashes, found), _STABLE_KEPT)
        return found
