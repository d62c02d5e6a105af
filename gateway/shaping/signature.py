"""The segment signatures of shaped requests, sampled per template for the cache report's
divergence view: the first requests of a template, then one in ten but at most
:data:`_SIGNED_PER_S` a second, line by line; the last signed head per template is kept,
so a repeat costs a compare."""

from __future__ import annotations

import time
import zlib
from itertools import compress
from operator import ne
from typing import Any

import orjson

from gateway.shaping.body import _HEAD_ROLES, _part_text, _tool_name
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.result import ShapeResult
from gateway.shaping.volatile import Detectors, keep

_SIGNED_FIRST = 20
_SIGN_EVERY = 10
_SIGNED_PER_S = 20
"""The report reads a template's last 20 signatures (``SIGNATURES_KEPT``): at a few hundred
requests a second, one in ten would replace them several times a second, and a conversation's
signature runs the detectors over each of its messages (8 % of the gateway's CPU on a load of
many conversations, bench/README.md at 7e28d41)."""
_now = time.monotonic
_SIGNED_KEPT = 64  # templates whose last signed head is kept (its lines and segments)
_STABLE_MAX_CHARS = 1 << 17  # a longer stable head is not kept (memory)


def _short(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"


class HeadSignatures:
    """:class:`~gateway.shaping.shaper.PolicyShaper`'s signature sample (a mixin: the shaper
    holds its state)."""

    policy: ShapingPolicy
    detectors: Detectors
    _seen: dict[str, int]
    _signed_in: dict[str, tuple[int, int]]
    """Per template, the second of its last signature and how many it had in that second."""
    _signed_heads: dict[
        str, tuple[str, list[str], list[tuple[str, str, str] | None], list[tuple[str, str, str]]]
    ]
    _read_head: tuple[str, list[str]]
    """The last string head read and its lines (a head that shaping left as it was is signed
    from them: no split)."""

    def _signature(self, body: dict[str, Any], result: ShapeResult) -> None:
        """The segments of the first requests of a template, then of every tenth, at most
        :data:`_SIGNED_PER_S` a second (the divergence report reads the last 20 kept: a
        sample is enough, and it costs)."""
        seen = self._seen
        template = result.template
        n = seen.get(template, 0)
        if len(seen) > 20_000:
            seen.clear()
            self._signed_in.clear()
        seen[template] = n + 1
        if n >= _SIGNED_FIRST:
            if n % _SIGN_EVERY:
                return
            second = int(_now())
            last, count = self._signed_in.get(template, (-1, 0))
            count = count + 1 if last == second else 1
            if count > _SIGNED_PER_S:
                return
            self._signed_in[template] = (second, count)
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
        read = self._read_head
        lines = read[1] if read[0] is content else content.split("\n")
        line_segment = self._line_segment
        if memo is not None and len(memo[1]) == len(lines):
            per_line = list(memo[2])
            for n in compress(range(len(lines)), map(ne, lines, memo[1])):
                per_line[n] = line_segment("line", n, lines[n])
        else:
            per_line = [line_segment("line", n, line) for n, line in enumerate(lines)]
        found = list(filter(None, per_line))
        if len(content) <= _STABLE_MAX_CHARS:
            keep(self._signed_heads, template, (content, lines, per_line, found), _SIGNED_KEPT)
        return found
