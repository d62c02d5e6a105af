"""The semantic check: did shaping change what a prompt means?

Used by the test suite and by ``bench/shaping.py`` over every shaped body. It finds the
original system prompt's structures by its own, deliberately simple rules (not the
shaper's segmenter, so that the check does not merely agree with itself) and reports,
as sentences, every way the shaped body differs in meaning:

- a markdown section, a fenced code block, an XML-like element, a delimited block (the
  lines between two identical rules, ``-----`` … ``-----``, both included) or a list (with
  the lead-in line before it) that does not arrive whole and byte-identical, line-aligned, in
  one system message;
- a system line lost or duplicated;
- a conversation turn (role, content, tool calls and their ids, tool-call id, name) changed,
  moved, added or dropped;
- a tool or the response schema changed in value, or in the order of any ``properties``,
  ``required`` or other array.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})(?:\s|$)")
_BREAK = re.compile(r"^\s{0,3}(?:={3,}|-{3,}|\*{3,}|_{3,})\s*$")
_OPEN = re.compile(r"^\s*<([A-Za-z][\w.:-]*)(?:\s[^<>]*)?>\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s")
_RULE = re.compile(r"^\s*(-{3,}|={3,}|\*{3,}|_{3,}|\+{3,}|#{3,})\s*$")
_TURN_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def structures(text: str) -> list[str]:
    """The structures of ``text`` that must arrive whole: sections, fences, delimited blocks,
    elements, lists."""
    lines = text.split("\n")
    found: list[tuple[int, int]] = []
    in_fence = [False] * len(lines)
    opens: set[int] = set()  # the lines that open a delimited block
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence.group(1)[0] * len(fence.group(1))):
                j += 1
            end = min(j + 1, len(lines))
            found.append((i, end))
            for k in range(i, end):
                in_fence[k] = True
            i = end
            continue
        rule = _RULE.match(lines[i])
        closes = [j for j in range(i + 1, len(lines)) if lines[j].strip() == rule.group(1)] if rule else []
        if closes:
            found.append((i, closes[0] + 1))
            opens.add(i)  # a section ends before it (a rule of '#' is no heading here)
            for k in range(i + 1, closes[0] + 1):
                in_fence[k] = True
            i = closes[0] + 1
            continue
        element = _OPEN.match(lines[i])
        if element:
            closing = f"</{element.group(1)}>"
            for j in range(i + 1, len(lines)):
                if closing in lines[j]:
                    found.append((i, j + 1))
                    for k in range(i + 1, j + 1):
                        in_fence[k] = True  # a heading, list or fence inside belongs to it
                    i = j
                    break
        i += 1
    for start, line in enumerate(lines):
        heading = _HEADING.match(line)
        if not heading or in_fence[start] or start in opens:
            continue
        end = start + 1
        while end < len(lines):
            if end in opens:
                break
            if not in_fence[end]:
                if _BREAK.match(lines[end]):
                    break
                deeper = _HEADING.match(lines[end])
                if deeper and len(deeper.group(1)) <= len(heading.group(1)):
                    break
            end += 1
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        found.append((start, end))
    n = 0
    while n < len(lines):
        if _ITEM.match(lines[n]) and not in_fence[n]:
            start = n - 1 if n > 0 and lines[n - 1].rstrip().endswith(":") else n
            end = n + 1
            while (
                end < len(lines)
                and lines[end].strip()
                and (_ITEM.match(lines[end]) or lines[end][:1] in " \t")
            ):
                end += 1
            found.append((start, end))
            n = end
            continue
        n += 1
    return ["\n".join(lines[a:b]) for a, b in found]


def _system_texts(body: dict[str, Any]) -> list[str]:
    texts = []
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(
                    str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
    return texts


def _turns(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        tuple(m.get(k) for k in _TURN_KEYS)
        for m in body.get("messages") or ()
        if isinstance(m, dict) and m.get("role") not in ("system", "developer")
    ]


def _orders(value: Any, path: str = "") -> dict[str, Any]:
    """The orders that mean something: every ``properties`` map's keys and every array (a
    list compares in order; the objects in it compare by value)."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, child in value.items():
            here = f"{path}/{key}"
            if key == "properties" and isinstance(child, dict):
                out[here] = list(child)
            out.update(_orders(child, here))
    elif isinstance(value, list):
        out[path] = value
        for n, child in enumerate(value):
            out.update(_orders(child, f"{path}/{n}"))
    return out


def _tool_key(tool: Any) -> str:
    if isinstance(tool, dict):
        function = tool.get("function")
        return str(function.get("name") if isinstance(function, dict) else tool.get("name"))
    return repr(tool)


def semantic_changes(original: dict[str, Any], shaped: dict[str, Any]) -> list[str]:
    """Every way ``shaped`` means something else than ``original`` (empty: the same meaning)."""
    problems: list[str] = []
    before, after = _system_texts(original), _system_texts(shaped)
    lines_before = Counter(line for t in before for line in t.split("\n") if line.strip())
    lines_after = Counter(line for t in after for line in t.split("\n") if line.strip())
    if lines_before != lines_after:
        lost = list((lines_before - lines_after).elements())[:3]
        added = list((lines_after - lines_before).elements())[:3]
        problems.append(f"system lines changed: lost {lost}, added {added}")
    aligned = ["\n" + t + "\n" for t in after]
    for text in before:
        for unit in structures(text):
            needle = "\n" + unit + "\n"
            if not any(needle in t for t in aligned):
                problems.append(f"structure broken: {unit[:80]!r}")
    if _turns(original) != _turns(shaped):
        problems.append("conversation turns changed")
    tools_before = {_tool_key(t): t for t in original.get("tools") or ()}
    tools_after = {_tool_key(t): t for t in shaped.get("tools") or ()}
    if tools_before != tools_after:
        problems.append("tools changed in value")
    for name, tool in tools_before.items():
        if name in tools_after and _orders(tool) != _orders(tools_after[name]):
            problems.append(f"tool {name}: an order that means something changed")
    fmt_before, fmt_after = original.get("response_format"), shaped.get("response_format")
    if fmt_before != fmt_after or _orders(fmt_before) != _orders(fmt_after):
        problems.append("response_format changed")
    return problems
