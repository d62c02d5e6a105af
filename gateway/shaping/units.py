"""The system prompt's self-contained units: what shaping may move, whole, or not at all.

A line is never moved out of the structure it belongs to. The text is cut, line-aligned,
into units:

- a **fenced code block** (```` ``` ```` or ``~~~`` up to its closing fence);
- a **delimited block**: the text between two identical delimiter lines (a rule of ``-``,
  ``=``, ``*``, ``_``, ``+`` or ``#``, three or more), both lines and every blank line
  inside included, with the line announcing it ("Context information is below.", a
  lead-in ending with ``:``) and up to two blank lines after that line: retrieved or
  pasted text framed by rules, which no other rule may cut;
- an **XML-like element** whose opening tag starts a line and whose closing tag ends a
  later one (``<memories>`` … ``</memories>``; nested elements of the same name counted);
- a **markdown section**: a heading and everything up to the next heading of its level or
  above, or a divider line such as ``====`` (its subsections, lists, elements and code
  blocks included);
- elsewhere, runs of lines glued together: a lead-in line ending with ``:`` and what
  follows it, a list (its items and their indented continuations), an indented line and
  the line it continues, consecutive ``key: value`` lines (a record), a table, and a
  sentence hard-wrapped over lines (a line without closing punctuation followed by one
  starting in lowercase);
- every other line is a unit of its own (a prompt written one instruction per line), and so
  is every blank line (blank lines never move).

Every line belongs to exactly one unit, units are contiguous and in order: joining the
units' lines with ``\\n`` gives the text back.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_OPEN_TAG = re.compile(r"^\s*<([A-Za-z][\w.:-]*)(?:\s[^<>]*)?>")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})(?:\s|$)")
_BREAK = re.compile(r"^\s{0,3}(?:={3,}|-{3,}|\*{3,}|_{3,})\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s")
_KEY_VALUE = re.compile(r"^[A-Za-z][\w '\u2019()/.-]{0,40}:\s*\S")
_ENDS_CLAUSE = tuple(".!?;:)]}\"'`>*|…")

_ANNOUNCES = re.compile(r"\b(?:below|following)\b[^.!?]*[.:]$", re.IGNORECASE)
# A sentence that names what it is ("The current date is 2026-12-07."): a subject with no
# colon before it (not "Note: ..."), a copula, one sentence; not one that starts by referring
# to its neighbours ("These rules are ...", "It is ...").
_NAMES_ITSELF = re.compile(
    r"^(?!(?i:this|these|that|those|it|its|they|he|she|here|there|such|also|and|but|or|so|then|"
    r"otherwise|however|each|both|all|the same|the above|the following)\b)"
    r"[A-Z][^:;]{0,80}?\b(?:is|are)\b(?:[^.!?;]|[.!?:](?=\S)){1,160}[.!?]$"
)
_REFERS = re.compile(r"\b(?:above|below|following|preceding|previous|aforementioned|as follows)\b", re.I)
_DELIMITER_CHARS = frozenset("-=*_+#")

# Line kinds: the structural role a line can have by itself (memoized per line text).
BLANK, HEADING, ITEM, INDENT, TABLE, LEAD_IN, KEY_VALUE, TEXT, BREAK = range(9)
DELIM = 9  # a delimited block (not a line kind: the kind :func:`segment` gives the block)
ELEMENT, FENCE, SECTION, LINES, DELIMITED = "element", "fence", "section", "lines", "delimited"


@dataclass(frozen=True, slots=True)
class Unit:
    """Lines ``start`` to ``end`` (exclusive) of the text, and what holds them together."""

    start: int
    end: int
    kind: str
    tag: str = ""
    """The element's tag name (``kind == "element"``, or a lead-in followed by one)."""


_kinds: dict[str, int] = {}


def line_kind(line: str) -> int:
    """What ``line`` is by itself (memoized: a template's lines repeat)."""
    found = _kinds.get(line)
    if found is not None:
        return found
    stripped = line.strip()
    if not stripped:
        kind = BLANK
    elif stripped[0].isalpha():
        # A line starting with a letter is no heading, divider or list item: the three
        # patterns need a mark or a digit first (a new line of a template costs less).
        kind = _plain_kind(line, stripped)
    elif _HEADING.match(line):
        kind = HEADING
    elif _BREAK.match(line):
        kind = BREAK
    elif _ITEM.match(line):
        kind = ITEM
    else:
        kind = _plain_kind(line, stripped)
    if len(_kinds) > 50_000:
        _kinds.clear()
    _kinds[line] = kind
    return kind


def _plain_kind(line: str, stripped: str) -> int:
    """:func:`line_kind` of a line that is not blank, a heading, a divider or a list item."""
    if line[0] in " \t":
        return INDENT
    if stripped[0] == "|":
        return TABLE
    if stripped.endswith(":"):
        return LEAD_IN
    if len(stripped) <= 80 and not stripped.endswith(".") and _KEY_VALUE.match(line):
        return KEY_VALUE  # a short "Key: value" field; "Rule 3: never ... ." is a sentence
    return TEXT


def level(heading: str) -> int:
    """A markdown heading's level (0: not a heading)."""
    found = _HEADING.match(heading)
    return len(found.group(1)) if found else 0


def glued(a: str, ka: int, b: str, kb: int) -> bool:
    """Whether line ``b`` belongs with the line ``a`` before it."""
    if ka == LEAD_IN:
        return True
    if kb == INDENT:
        return True
    if kb == ITEM and ka in (ITEM, INDENT):
        return True
    if ka == kb and ka in (KEY_VALUE, TABLE):
        return True
    if kb == LEAD_IN and ka == KEY_VALUE:
        return True
    # A sentence hard-wrapped over two lines.
    return not a.rstrip().endswith(_ENDS_CLAUSE) and b[:1].islower()


def delimiter(line: str) -> str:
    """The line's delimiter (its text, stripped) when it is a rule of one character repeated
    three times or more (``-----``, ``===``, ``###``); "" otherwise."""
    stripped = line.strip()
    if len(stripped) >= 3 and stripped[0] in _DELIMITER_CHARS and stripped == stripped[0] * len(stripped):
        return stripped
    return ""


def announces(line: str) -> bool:
    """Whether a line announces what follows ("Context information is below.")."""
    return _ANNOUNCES.search(line.rstrip()) is not None


def self_contained(line: str) -> bool:
    """Whether ``line`` is a sentence that names what it is ("The current date is ..."): it
    reads the same wherever it stands, so it may end the text after a final section."""
    if not line.endswith((".", "!", "?")) or (" is " not in line and " are " not in line):
        return False  # most lines: no regex
    return _NAMES_ITSELF.match(line) is not None and _REFERS.search(line) is None


def _section_tail(
    lines: list[str], blocks: list[tuple[int, int, str, str]], kinds: list[int], k: int, last: int
) -> int:
    """The last block of a section that runs to the end of the text (heading block ``k``, last
    non-blank block ``last``): the one before ``last`` when ``last`` is a self-contained
    sentence (:func:`self_contained`) that does not read as part of the line before it, and
    the section has more than that sentence; else ``last``. So a sentence shaping placed
    after a final section reads back as its own unit (and an app's own such last line too)."""
    start, end, _, _ = blocks[last]
    if kinds[last] != TEXT or end != start + 1 or not self_contained(lines[start]):
        return last
    before = next((p for p in range(last - 1, k, -1) if kinds[p] != BLANK), k)
    if before == k:
        return last  # the sentence is the section's only content: it stays under its heading
    if blocks[before][2] == LINES and glued(lines[blocks[before][1] - 1], kinds[before], lines[start], TEXT):
        return last
    return before


def _delimited_end(lines: list[str], start: int, rule: str) -> int:
    """The index after the line that repeats the delimiter ``rule`` opened at ``start``; 0 when
    none does (then the line is a divider of its own)."""
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == rule:
            return j + 1
    return 0


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    """The index after the fence opened at ``start`` closes (the end of the text if never)."""
    for j in range(start + 1, len(lines)):
        if lines[j].strip().startswith(fence[0] * len(fence)):
            return j + 1
    return len(lines)


def _element_end(lines: list[str], start: int, tag: str) -> int:
    """The index after the line closing the element opened at ``start`` (nested elements of
    its name counted); 0 when it does not close on a later line (then the line is text)."""
    opening = re.compile(rf"<{re.escape(tag)}(?:\s[^<>]*)?>")
    closing = f"</{tag}>"
    first = lines[start]
    head = _OPEN_TAG.match(first)
    rest = first[head.end() :] if head else first
    if closing in rest:
        return 0  # opened and closed on one line
    depth, first_close = 1, 0
    for j in range(start + 1, len(lines)):
        line = lines[j]
        if "<" not in line:
            continue
        closes = line.count(closing)
        if closes and not first_close:
            first_close = j + 1
        depth += len(opening.findall(line)) - closes
        if depth <= 0:
            return j + 1
    # Unbalanced: up to its first closing tag at least (the larger unit is the safe reading).
    return first_close


def _blocks(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """Fences and elements as single blocks, every other line as its own: (start, end, kind, tag)."""
    blocks: list[tuple[int, int, str, str]] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            end = _fence_end(lines, i, fence.group(1))
            blocks.append((i, end, FENCE, ""))
            i = end
            continue
        rule = delimiter(line)
        if rule:
            end = _delimited_end(lines, i, rule)
            if end:
                blocks.append((i, end, DELIMITED, ""))
                i = end
                continue
        tag = _OPEN_TAG.match(line) if "<" in line else None
        if tag:
            end = _element_end(lines, i, tag.group(1))
            if end:
                blocks.append((i, end, ELEMENT, tag.group(1)))
                i = end
                continue
        blocks.append((i, i + 1, LINES, ""))
        i += 1
    return blocks


def segment(lines: list[str]) -> list[Unit]:
    """Cut ``lines`` into self-contained units (see the module docstring)."""
    units: list[Unit] = []
    blocks = _blocks(lines)
    kinds = [line_kind(lines[b[0]]) if b[2] == LINES else DELIM if b[2] == DELIMITED else -1 for b in blocks]
    k, n = 0, len(blocks)
    while k < n:
        start, end, kind, tag = blocks[k]
        if kinds[k] == BLANK:
            units.append(Unit(start, end, LINES))
            k += 1
            continue
        if kinds[k] == HEADING:
            # A section holds its subsections: it ends at a heading of its level or above,
            # or at a divider line (``====``).
            depth = level(lines[start])
            last = k
            j = k + 1
            while (
                j < n
                and kinds[j] != BREAK
                and kinds[j] != DELIM
                and (kinds[j] != HEADING or level(lines[blocks[j][0]]) > depth)
            ):
                if kinds[j] != BLANK:
                    last = j
                j += 1
            if j == n:
                last = _section_tail(lines, blocks, kinds, k, last)
            units.append(Unit(start, blocks[last][1], SECTION))
            k = last + 1
            continue
        if kinds[k] in (LEAD_IN, TEXT) and end == start + 1:
            # A line announcing a delimited block, up to two blank lines before it: one unit.
            m = k + 1
            while m < n and m <= k + 2 and kinds[m] == BLANK:
                m += 1
            if m < n and kinds[m] == DELIM and (kinds[k] == LEAD_IN or announces(lines[start])):
                units.append(Unit(start, blocks[m][1], DELIMITED))
                k = m + 1
                continue
        # A run of glued blocks (an element, fence or delimited block glues only to a lead-in
        # before it).
        j = k
        while j + 1 < n:
            a, b = blocks[j], blocks[j + 1]
            ka, kb = kinds[j], kinds[j + 1]
            if kb in (BLANK, HEADING, BREAK):
                break
            if a[2] != LINES or (b[2] != LINES and ka != LEAD_IN):
                break
            if b[2] == LINES and not glued(lines[a[1] - 1], ka, lines[b[0]], kb):
                break
            j += 1
        if j == k:
            units.append(Unit(start, end, kind, tag))
        else:
            last_block = blocks[j]
            glued_tag = last_block[3] if j == k + 1 and kinds[k] == LEAD_IN else ""
            units.append(Unit(start, last_block[1], ELEMENT if glued_tag else LINES, glued_tag))
        k = j + 1
    return units


_shape_ids: dict[str, int] = {}
_plain_shapes: dict[tuple[int, bool, bool, int, bool, bool], int] = {}
_digit_shapes: dict[bytes, int] = {}  # by the line with its digits as 0: no pattern tells them apart
_own_shapes = itertools.count(1)  # never reused, even after the memo is cleared
_segments: dict[tuple[int, ...], tuple[list[Unit], list[tuple[int, int]]]] = {}
_DIGITS = bytes.maketrans(b"123456789", b"000000000")  # over UTF-8: digits are ASCII bytes


def _shape_id(line: str) -> int:
    """An id for everything :func:`segment` reads in ``line``: for an ordinary line its kind,
    whether it closes a clause, whether it starts in lowercase and its heading level; a line
    that may open or close an element or a fence is its own shape. Lines differing only in
    their digits (a time, a count) have the same shape: found by the line with its digits
    as ``0``, without the patterns."""
    if "<" in line or "`" in line or "~" in line or delimiter(line):
        # A delimiter pairs with the same text only: its own shape, like a tag's line.
        shape = -next(_own_shapes)
    else:
        digits = line.encode("utf-8", "surrogatepass").translate(_DIGITS)
        found = _digit_shapes.get(digits)
        if found is None:
            kind = line_kind(line)
            # Only a heading has a level (the same pattern decides both).
            depth = level(line) if kind == HEADING else 0
            key = (
                kind,
                line.rstrip().endswith(_ENDS_CLAUSE),
                line[:1].islower(),
                depth,
                kind in (LEAD_IN, TEXT) and announces(line),
                kind == TEXT and self_contained(line),
            )
            found = _plain_shapes.setdefault(key, len(_plain_shapes))
            if len(_digit_shapes) > 50_000:
                _digit_shapes.clear()
            _digit_shapes[digits] = found
        shape = found
    if len(_shape_ids) > 50_000:
        _shape_ids.clear()
    _shape_ids[line] = shape
    return shape


def same_shape(a: str, b: str) -> bool:
    """Whether :func:`segment` reads lines ``a`` and ``b`` alike (a line that may open or close
    an element or a fence is like no other line)."""
    if a == b:
        return True
    shape_a = _shape_ids.get(a)
    if shape_a is None:
        shape_a = _shape_id(a)
    shape_b = _shape_ids.get(b)
    if shape_b is None:
        shape_b = _shape_id(b)
    return shape_a == shape_b


def segment_cached(lines: list[str]) -> tuple[list[Unit], list[tuple[int, int]]]:
    """:func:`segment`, memoized by the lines' shapes: a template's requests differ in values,
    rarely in shape, so the per-request cost is a lookup per line. Also the line ranges outside
    elements, code blocks and delimited blocks (where a template's skeleton is read)."""
    known: list[int | None] = list(map(_shape_ids.get, lines))
    start = 0
    while None in known:  # the new lines only (C-speed scans between them)
        start = known.index(None, start)
        known[start] = _shape_id(lines[start])
    key: tuple[int, ...] = tuple(known)  # type: ignore[arg-type]  # no None left
    found = _segments.get(key)
    if found is None:
        units = segment(lines)
        ranges: list[tuple[int, int]] = []
        for unit in units:
            if unit.kind in (ELEMENT, FENCE, DELIMITED):
                continue  # retrieved or pasted text: no template is named by it
            if ranges and ranges[-1][1] == unit.start:
                ranges[-1] = (ranges[-1][0], unit.end)
            else:
                ranges.append((unit.start, unit.end))
        if len(_segments) > 4096:
            _segments.clear()
        found = _segments[key] = (units, ranges)
    return found


def unit_text(lines: list[str], unit: Unit) -> str:
    """The unit's bytes: its lines joined with ``\\n``."""
    return "\n".join(lines[unit.start : unit.end])
