"""Prompt shaping: stable content first, volatile content last, nothing that means something moved.

The unit of the system prompt is the line (its parts, for array content). The head
system (or developer) message's volatile lines — found by the detectors or by the
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
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.stability import StabilityModel, line_hash
from gateway.shaping.volatile import Detectors
from gateway.store.writer import StatsWriter

_HEAD_ROLES = ("system", "developer")
_TEMPLATE_LINES = 3


@dataclass(slots=True)
class ShapeResult:
    """What shaping did to one request."""

    template: str = "-"
    moved: int = 0
    rag_moved: bool = False
    tools_sorted: bool = False
    stable_prefix_tokens: int = 0
    head_stable_chars: int = 0
    """How much of the head system message (after shaping) is the stable part."""
    prefix_hash: str = ""
    """Hash of the tools and the stable head: the natural ``prompt_cache_key``."""
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
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(function["arguments"])
                function["arguments"] = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()


def _short(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return f"{zlib.crc32(raw):08x}"


class Shaper:
    """The shaping of one policy (detectors compiled once)."""

    def __init__(self, policy: ShapingPolicy) -> None:
        self.policy = policy
        self.detectors = Detectors(policy.detectors, policy.volatile_patterns)
        self._canonical_memo: dict[bytes, Any] = {}

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
        tool names and its three longest system lines, masked (short lines such as a user's
        name or the date do not change it)."""
        policy = self.policy
        result = ShapeResult()
        messages = body.get("messages")
        if not isinstance(messages, list) or not policy.enabled:
            return result
        tools = body.get("tools")
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
        tool_names = ",".join(_tool_name(t) for t in tools) if isinstance(tools, list) else ""
        head = messages[0] if messages and isinstance(messages[0], dict) else None
        if head is not None and head.get("role") in _HEAD_ROLES and isinstance(head.get("content"), str):
            self._shape_head(body, messages, head, tool_names, result, stability, writer, template)
        else:
            result.template = template or (_short(tool_names) if tool_names else "-")
        tools_json = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS) if isinstance(tools, list) else b""
        result.stable_prefix_tokens += len(tools_json) // 4
        head_text = head.get("content") if head is not None and head.get("role") in _HEAD_ROLES else None
        stable_head = head_text[: result.head_stable_chars] if isinstance(head_text, str) else ""
        result.prefix_hash = hashlib.blake2b(tools_json + stable_head.encode(), digest_size=8).hexdigest()
        self._signature(body, result)
        return result

    def _shape_head(
        self,
        body: dict[str, Any],
        messages: list[Any],
        head: dict[str, Any],
        tool_names: str,
        result: ShapeResult,
        stability: StabilityModel | None,
        writer: StatsWriter | None,
        template: str | None,
    ) -> None:
        policy = self.policy
        text: str = head["content"]
        rag_block = ""
        if policy.rag.enabled:
            text, rag_block = _cut_rag(text, policy.rag.markers)
        lines = text.split("\n")
        detected = [self.detectors.line(line) for line in lines]
        longest = sorted((masked for _, masked in detected), key=len, reverse=True)[:_TEMPLATE_LINES]
        result.template = template or _short("\n".join(sorted(longest)) + "|" + tool_names)
        learned: list[bool | None] = [None] * len(lines)
        if stability is not None and policy.learn:
            hashes = [line_hash(line) for line in lines]
            learned = stability.verdicts(
                result.template, hashes, policy.learn_min_requests, policy.stable_share
            )
            stability.observe(result.template, hashes, writer)
        stable: list[str] = []
        volatile: list[str] = []
        for line, (flagged, _), known in zip(lines, detected, learned, strict=True):
            is_volatile = flagged if known is None else not known
            # A blank line carries no content: it stays with the stable lines.
            (volatile if is_volatile and line.strip() else stable).append(line)
        stable_text = "\n".join(stable)
        result.stable_prefix_tokens = len(stable_text) // 4
        result.head_stable_chars = len(stable_text)
        if not volatile and not rag_block:
            result.head_stable_chars = len(text)
            return
        if not [line for line in stable if line.strip()]:
            result.head_stable_chars = 0
            return  # everything is volatile: nothing to gain by moving
        result.moved = len(volatile)
        result.rag_moved = bool(rag_block)
        new_head = "\n".join(stable)
        if rag_block:
            new_head = new_head.rstrip("\n") + "\n" + rag_block
        last_user = _last_user_index(messages)
        if volatile and policy.placement == "before_last_user" and last_user > 0:
            head["content"] = new_head
            messages.insert(last_user, {"role": head["role"], "content": "\n".join(volatile)})
        else:
            head["content"] = new_head + ("\n" + "\n".join(volatile) if volatile else "")

    def _signature(self, body: dict[str, Any], result: ShapeResult) -> None:
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
                for n, line in enumerate(content.split("\n")):
                    if line.strip():
                        preview = self.detectors.line(line)[1][:80] if previews else ""
                        segments.append((f"system line {n + 1}", _short(line), preview))
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
    """Take the first marked retrieval block out of ``text``; (rest, block)."""
    for start_marker, end_marker in markers:
        start = text.find(start_marker)
        if start < 0:
            continue
        end = text.find(end_marker, start + len(start_marker))
        if end < 0:
            continue
        end += len(end_marker)
        before, block, after = text[:start], text[start:end], text[end:]
        if not before.strip() or not after.strip():
            return text, ""  # already first or last: nothing to move it past
        # The block leaves its line breaks behind: the text around it joins with one newline.
        rest = before.rstrip("\n") + "\n" + after.lstrip("\n")
        return rest, block
    return text, ""
