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
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.stability import StabilityModel
from gateway.shaping.volatile import Detectors, line_hash
from gateway.store.writer import StatsWriter

_HEAD_ROLES = ("system", "developer")
_NOT_TEXT = (False, "", "")
_SIGNED_FIRST = 20
_SIGN_EVERY = 10
_LONG_NUMBER = re.compile(r"\d{16}")


@dataclass(slots=True)
class ShapeResult:
    """What shaping did to one request."""

    template: str = "-"
    moved: int = 0
    rag_moved: bool = False
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
        return "; ".join(parts)


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

    def __init__(self, policy: ShapingPolicy) -> None:
        self.policy = policy
        self.detectors = Detectors(policy.detectors, policy.volatile_patterns)
        self._canonical_memo: dict[bytes, Any] = {}
        self._seen: dict[str, int] = {}  # requests per template, for sampling signatures

    def _canonical(self, obj: Any) -> Any:
        """``obj`` with every key sorted, at every depth (memoized: tool lists repeat)."""
        raw = orjson.dumps(obj)
        found = self._canonical_memo.get(raw)
        if found is None:
            found = orjson.loads(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))
            if len(self._canonical_memo) > 4096:
                self._canonical_memo.clear()
            self._canonical_memo[raw] = found
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
                result.template = template or self._template(
                    [t for t in _texts(head["content"]) if t is not None], tool_names
                )
            self._signature(body, result)
            return result
        if isinstance(tools, list) and tools:
            if policy.canonical_json:
                body["tools"] = tools = [self._canonical(tool) for tool in tools]
            if policy.sort_tools:
                ordered = sorted(tools, key=_tool_name)
                result.tools_sorted = ordered != tools
                body["tools"] = tools = ordered
        if policy.canonical_json:
            _canonical_arguments(messages)
            fmt = body.get("response_format")
            if isinstance(fmt, dict):
                body["response_format"] = self._canonical(fmt)
        stable_head = b""
        if head is not None:
            stable_head = self._shape_head(messages, head, tool_names, result, stability, writer, template)
        tools_json = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if isinstance(tools, list) else b""
        result.stable_prefix_tokens += len(tools_json) // 4
        result.prefix_hash = hashlib.blake2b(tools_json + stable_head, digest_size=8).hexdigest()
        self._signature(body, result)
        return result

    def _template(self, lines: list[str], tool_names: str) -> str:
        longest = max(lines, key=len, default="")
        return line_hash(self.detectors.line(longest)[1] + "|" + tool_names)

    def _shape_head(
        self,
        messages: list[Any],
        head: dict[str, Any],
        tool_names: str,
        result: ShapeResult,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        template: str | None,
    ) -> bytes:
        """Shape the head message; the hashes of its stable units (for the prefix hash)."""
        policy = self.policy
        content: str | list[Any] = head["content"]
        rag_block = ""
        detect = self.detectors.line
        units: list[Any]
        joined = isinstance(content, str)
        if isinstance(content, str):
            text = content
            if policy.rag.enabled:
                text, rag_block = _cut_rag(text, policy.rag.markers)
            units = lines = text.split("\n")
            texts: list[str | None] = list(units)
            detected = [detect(t) for t in units]
            hashes = [d[2] for d in detected]
        else:
            units = content
            texts = _texts(content)
            lines = [t for t in texts if t is not None]
            detected = [detect(t) if t is not None else _NOT_TEXT for t in texts]
            # A non-text part is counted by its JSON (another image is another part).
            hashes = [
                h if t is not None else line_hash(orjson.dumps(u).decode())
                for t, u, (_, _, h) in zip(texts, units, detected, strict=True)
            ]
        result.template = template or self._template(lines, tool_names)
        # A line moves when a detector fires, or when the counts of its template say it
        # varies; blank lines and non-text parts carry nothing that varies: they stay.
        if stability is not None and policy.learn:
            learned = stability.verdicts(
                result.template, hashes, policy.learn_min_requests, policy.stable_share
            )
            stability.observe(result.template, hashes, writer)
            moving = [
                d[0] if k is None else (not k and t is not None and bool(t.strip()))
                for t, d, k in zip(texts, detected, learned, strict=True)
            ]
        else:
            moving = [d[0] for d in detected]
        volatile = [u for u, m in zip(units, moving, strict=True) if m]
        stable = [u for u, m in zip(units, moving, strict=True) if not m]
        kept = [t for t, m in zip(texts, moving, strict=True) if not m]
        stable_key = "".join([h for h, m in zip(hashes, moving, strict=True) if not m]).encode()
        stable_chars = sum(map(len, stable)) if joined else sum(len(t) for t in kept if t is not None)
        has_stable = any(t is None or t.strip() for t in kept)
        result.stable_prefix_tokens = stable_chars // 4
        if not has_stable or (not volatile and not rag_block):
            # Nothing volatile, or nothing but: either way nothing to gain by moving.
            if has_stable:
                result.head_stable_chars = len(content) if joined else 0
                result.head_stable_parts = 0 if joined else len(units)
            return stable_key if has_stable else b""
        result.moved = len(volatile)
        result.rag_moved = bool(rag_block)
        new_head: str | list[Any]
        tail: str | list[Any]
        if joined:
            instructions = "\n".join(stable)
            result.head_stable_chars = len(instructions)
            new_head = instructions.rstrip("\n") + "\n" + rag_block if rag_block else instructions
            tail = "\n".join(volatile)
        else:
            new_head, tail = stable, volatile
            result.head_stable_parts = len(stable)
        last_user = _last_user_index(messages)
        if volatile and policy.placement == "before_last_user" and last_user > 0:
            head["content"] = new_head
            messages.insert(last_user, {"role": head["role"], "content": tail})
        else:
            shaped = (f"{new_head}\n{tail}" if volatile else new_head) if joined else [*stable, *volatile]
            if shaped == content:  # already stable first, volatile last: a shaped request
                result.moved, result.rag_moved = 0, False
            head["content"] = shaped
        return stable_key

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
            if i == 0 and role in _HEAD_ROLES and isinstance(content, (str, list)):
                unit = "line" if isinstance(content, str) else "part"
                pieces = content.split("\n") if isinstance(content, str) else content
                for n, piece in enumerate(pieces):
                    text = piece if isinstance(piece, str) else _part_text(piece)
                    if text is None:
                        segments.append((f"system {unit} {n + 1}", _short(orjson.dumps(piece)), ""))
                    elif text.strip():
                        _, masked, h = self.detectors.line(text)
                        segments.append((f"system {unit} {n + 1}", h, masked[:80] if previews else ""))
                continue
            data = orjson.dumps(content)
            preview = (
                self.detectors.line(str(content)[:200])[1][:80]
                if previews and isinstance(content, str)
                else ""
            )
            segments.append((f"message {i + 1} ({role})", _short(data), preview))


def _last_user_index(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, 0, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            return i
    return -1


def _cut_rag(text: str, markers: list[tuple[str, str]]) -> tuple[str, str]:
    """Take the marked retrieval block out of ``text``; (rest, block). Text with two blocks of
    one kind is left as it is: which one is the retrieved one is a guess, and moving either
    would reorder them on every pass."""
    for start_marker, end_marker in markers:
        start = text.find(start_marker)
        if start < 0:
            continue
        end = text.find(end_marker, start + len(start_marker))
        if end < 0:
            continue
        end += len(end_marker)
        if text.find(start_marker, end) >= 0:
            return text, ""
        before, block, after = text[:start].rstrip("\n"), text[start:end], text[end:].lstrip("\n")
        if not before.strip() and not after.strip():
            return text, ""  # nothing but the block: nothing to move it past
        # Cut out even when it is already last: its lines are never shaped one by one. It
        # leaves its line breaks behind: the text around it joins with one newline.
        return "\n".join(part for part in (before, after) if part), block
    return text, ""
