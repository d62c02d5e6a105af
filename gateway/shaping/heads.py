"""Reading a head system message: its units, verdicts, hashes, retrieval block and skeleton.

A template's requests repeat its system prompt with a few values changed (a time, a working
directory). Reading a 556-line prompt from scratch costs far more than the rest of shaping,
so a head is read *against the last one of its template shape* (same tools, same line
count): the lines that varied before are checked first (``str.startswith`` over the stable
stretches between them, no copy), and only the units holding a changed line are read again.
Anything that could change the segmentation (a changed line's shape, a tag, a retrieval
marker, the skeleton's line) falls back to a full read. The result is the same as a full
read, line for line; the cost follows what changed, not the prompt's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import itemgetter, ne
from typing import NamedTuple

from gateway.shaping.units import (
    DELIMITED,
    ELEMENT,
    SECTION,
    Unit,
    delimiter,
    same_shape,
    segment_cached,
    unit_text,
)
from gateway.shaping.volatile import Detectors, keep, line_hash

_FIRST, _THIRD = itemgetter(0), itemgetter(2)
_TOOL_SETS_KEPT = 256  # tool sets (templates, mostly) remembered per policy
_SHAPES_KEPT = 4  # heads remembered per tool set, one per line count
_MAX_CHANGED = 16  # more changed lines than this: read the head afresh
_EXACT_KEPT = 512  # heads remembered by their exact text (a template's users repeat theirs)
_EXACT_MAX_CHARS = 1 << 17  # longer heads are not remembered whole (memory)
_SAMPLE_CHARS = 96  # a head's first and last characters, with its length, find its repeats
_BUCKET_KEPT = 4  # heads kept per length and ends (one line varying in the middle: the latest)


class Head(NamedTuple):
    """A head's text as read; shared, never mutated."""

    lines: list[str]
    units: list[Unit]
    texts: list[str]
    detected: list[bool]
    hashes: list[str]
    rag: int
    rag_hash: str
    """The retrieval block's identity: the hash of its element lines alone, without the lead-in
    or heading it may read as having (a line placed before it on one pass must not make it
    look retrieved anew on the next)."""
    skeleton: str
    ambiguous: bool
    """An element holds another of its name (read with its nesting counted or up to its first
    closing tag, its extent differs, and which one the model reads is a guess), or no line
    that stays names the template: nothing moves."""
    rag_blocks: tuple[int, ...] = ()
    """With more than one block that reads as a retrieval block, all of them (none moves:
    which one is retrieved would be a guess, and moving one would make the other *the*
    block on the next pass)."""


@dataclass(slots=True)
class _Recent:
    """The last head read for one template shape, and what is needed to read the next one
    against it."""

    content: str
    head: Head
    varying: list[int]
    """Lines that differed between the heads read for this shape (checked first)."""
    pieces: list[str]
    """The text between the varying lines (``len(varying) + 1`` stretches)."""
    line_unit: list[int]
    """Per line, the index of its unit."""
    fired: list[bool]
    """Per line, whether a detector fires in it."""
    skeleton_line: int
    skeleton_len: int
    counted: frozenset[int] | None
    """The lines the skeleton is chosen from (None: all)."""


def _pieces(lines: list[str], varying: list[int]) -> list[str]:
    """The stretches of text around the ``varying`` lines (see :meth:`HeadReader._match`)."""
    out = []
    start = 0
    for v in varying:
        text = "\n".join(lines[start:v])
        out.append(("\n" if start else "") + text + ("\n" if v > start else ""))
        start = v + 1
    if not varying:
        out.append("\n".join(lines))
    elif start < len(lines):
        out.append("\n" + "\n".join(lines[start:]))
    else:
        out.append("")
    return out


def rag_unit(
    units: list[Unit], lines: list[str], markers: list[tuple[str, str]]
) -> tuple[int, int, tuple[int, ...]]:
    """The index of the retrieval block: the one unit that opens, on a line of its own, with
    a marker and closes with it (a marker inside a sentence, a code block or another element
    is not one), else the one delimited block a line announces; -1 when there is none, or
    more than one (which is the retrieved one would be a guess, and moving either would
    reorder them on every pass). Second, the line its element opens on (after its heading
    or lead-in, if it has one); third, with more than one such block, all of them."""
    found, found_start = -1, 0
    candidates: list[int] = []
    for i, unit in enumerate(units):
        if unit.end - unit.start < 2:
            continue
        start = unit.start
        first, last = lines[start].strip(), lines[unit.end - 1].strip()
        if unit.kind == SECTION or first.endswith(":"):
            # A heading or a lead-in, then the block: they move with it.
            start = next((n for n in range(unit.start + 1, unit.end) if lines[n].strip()), unit.end - 1)
            first = lines[start].strip()
        for start_marker, end_marker in markers:
            if first.startswith(start_marker) and last.endswith(end_marker):
                candidates.append(i)
                found, found_start = i, start
                break
    if not candidates:
        # No marked block: a delimited block that a line announces ("Context information is
        # below.") is the retrieved text (many RAG templates frame it with rules, no tags).
        for i, unit in enumerate(units):
            if unit.kind == DELIMITED and not delimiter(lines[unit.start]):
                candidates.append(i)
                found = i
                found_start = next(n for n in range(unit.start, unit.end) if delimiter(lines[n]))
    if len(candidates) > 1:
        return -1, 0, tuple(candidates)
    return found, found_start, ()


def _opens(line: str, tag: str) -> int:
    """How many times ``line`` opens an element named ``tag``."""
    return line.count(f"<{tag}>") + line.count(f"<{tag} ")


class HeadReader:
    """Reads heads for one policy (its detectors and retrieval markers)."""

    def __init__(self, detectors: Detectors, rag_markers: list[tuple[str, str]] | None) -> None:
        self.detectors = detectors
        self.rag_markers = rag_markers
        self._recent: dict[str, list[_Recent]] = {}  # per tool set, the most recent first
        # Heads seen before, by their exact text and tool set: a repeat is one lookup (a head
        # is immutable and depends on its text and tools alone).
        self._exact: dict[tuple[int, str, str, str], list[tuple[str, Head]]] = {}

    def template(self, lines: list[str], tool_names: str) -> str:
        """A template named by its longest line, masked, and its tool names."""
        longest = max(lines, key=len, default="")
        return line_hash(self.detectors.line(longest)[1] + "|" + tool_names)

    def read(self, content: str, tool_names: str) -> Head:
        """What ``content`` reads as (the same as a full read, at the cost of what changed
        since the last head of its template shape)."""
        # Heads seen before, found by their length and ends (hashing all of a long head would
        # cost more than reading it against the last one) and then compared whole.
        key = (len(content), content[:_SAMPLE_CHARS], content[-_SAMPLE_CHARS:], tool_names)
        exact = self._exact
        bucket = exact.get(key)
        if bucket is not None:
            for seen, head in bucket:
                if seen == content:
                    return head
        head = self._read(content, tool_names)
        if len(content) <= _EXACT_MAX_CHARS:
            if bucket is None:
                bucket = keep(exact, key, [], _EXACT_KEPT)
            bucket.insert(0, (content, head))
            del bucket[_BUCKET_KEPT:]
        return head

    def _read(self, content: str, tool_names: str) -> Head:
        """:meth:`read` without the exact-repeat lookup."""
        recents = self._recent.get(tool_names)
        if recents is None:
            recents = keep(self._recent, tool_names, [], _TOOL_SETS_KEPT)
        for n, recent in enumerate(recents):
            # Checked first: the lines that varied before (a time, a name), nothing else moved.
            found = self._match(recent, content)
            if found is not None:
                head = self._update(recent, content, found)
                if head is not None:
                    if n:
                        recents.insert(0, recents.pop(n))
                    return head
                break
        else:
            line_count = content.count("\n")
            for recent in recents:
                if len(recent.head.lines) == line_count + 1:
                    head = self._update(recent, content, None)
                    if head is not None:
                        return head
                    break
        lines = content.split("\n")
        head, skeleton_line, counted, fired = self._full(lines, tool_names)
        line_unit = [i for i, unit in enumerate(head.units) for _ in range(unit.end - unit.start)]
        recents[:] = [r for r in recents if len(r.head.lines) != len(lines)][: _SHAPES_KEPT - 1]
        recents.insert(
            0,
            _Recent(
                content,
                head,
                [],
                [content],
                line_unit,
                fired,
                skeleton_line,
                len(lines[skeleton_line]),
                counted,
            ),
        )
        return head

    def _full(self, lines: list[str], tool_names: str) -> tuple[Head, int, frozenset[int] | None, list[bool]]:
        """A full read: the head, its skeleton's line, the lines a skeleton is chosen from and
        per line whether a detector fires."""
        units, outside = segment_cached(lines)
        detect = self.detectors.line
        verdicts = list(map(detect, lines))
        texts: list[str] = []
        detected: list[bool] = []
        hashes: list[str] = []
        if len(units) == len(lines):  # one instruction per line: every unit a line
            texts = lines
            detected = list(map(_FIRST, verdicts))
            hashes = list(map(_THIRD, verdicts))
            units_of_lines: list[Unit] = []
        else:
            units_of_lines = units
        for unit in units_of_lines:
            if unit.end - unit.start == 1:
                texts.append(lines[unit.start])
                detected.append(verdicts[unit.start][0])
                hashes.append(verdicts[unit.start][2])
            else:
                text = unit_text(lines, unit)
                texts.append(text)
                detected.append(any(v[0] for v in verdicts[unit.start : unit.end]))
                hashes.append(line_hash(text))
        rag, element_start, rag_blocks = (
            rag_unit(units, lines, self.rag_markers) if self.rag_markers else (-1, 0, ())
        )
        rag_hash = line_hash("\n".join(lines[element_start : units[rag].end])) if rag >= 0 else ""
        fired = list(map(_FIRST, verdicts))
        # A line of a unit a detector fires in may move out of the head: not the skeleton's.
        loud = [d for d, unit in zip(detected, units, strict=True) for _ in range(unit.end - unit.start)]
        skeleton, skeleton_line, counted = self._skeleton(
            lines, outside, units[rag] if rag >= 0 else None, tool_names, loud
        )
        ambiguous = any(
            unit.kind == ELEMENT and sum(_opens(line, unit.tag) for line in lines[unit.start : unit.end]) > 1
            for unit in units
        )
        # No line that stays names the template (outside elements, code and volatile units):
        # once a volatile one moved out, the template, and the conversation it keys, would
        # change, and with them what moves: nothing does.
        ambiguous = ambiguous or counted is None or all(loud[i] for i in counted)
        head = Head(lines, units, texts, detected, hashes, rag, rag_hash, skeleton, ambiguous, rag_blocks)
        return head, skeleton_line, counted, fired

    def _skeleton(
        self,
        lines: list[str],
        outside: list[tuple[int, int]],
        rag: Unit | None,
        tool_names: str,
        loud: list[bool],
    ) -> tuple[str, int, frozenset[int] | None]:
        """The template: its tool names and its longest line, masked, outside the elements and
        code blocks (where memories, retrieved passages and pasted files sit) and the
        retrieval block, and outside the units a detector fires in (``loud``: a time or a
        date may move out of the head, and the template must not change with it). Also that
        line's index and the lines it was chosen from."""
        ranges = [(a, b) for a, b in outside if rag is None or not (rag.start <= a and b <= rag.end)]
        if not ranges:
            index = max(range(len(lines)), key=lambda i: len(lines[i]))
            return self.template(lines, tool_names), index, None
        candidates = [i for a, b in ranges for i in range(a, b)]
        quiet = [i for i in candidates if not loud[i]]
        index = max(quiet or candidates, key=lambda i: len(lines[i]))
        counted = frozenset(candidates)
        return line_hash(self.detectors.line(lines[index])[1] + "|" + tool_names), index, counted

    def _match(self, recent: _Recent, content: str) -> list[str] | None:
        """The texts of the varying lines in ``content``, if every other byte is as before."""
        pieces = recent.pieces
        pos = 0
        found = []
        startswith, find = content.startswith, content.find
        for piece in pieces[:-1]:
            if not startswith(piece, pos):
                return None
            pos += len(piece)
            end = find("\n", pos)
            if end < 0:
                end = len(content)
            found.append(content[pos:end])
            pos = end
        last = pieces[-1]
        if not startswith(last, pos) or pos + len(last) != len(content):
            return None
        return found

    def _update(self, recent: _Recent, content: str, texts_found: list[str] | None) -> Head | None:
        """``content`` read against ``recent``, with the texts of its varying lines when only
        they may differ (None: compare every line); None: read it afresh."""
        old = recent.head
        if texts_found is not None:
            lines = list(old.lines)
            changed = []
            for v, text in zip(recent.varying, texts_found, strict=True):
                if text != lines[v]:
                    lines[v] = text
                    changed.append(v)
            varying = recent.varying
        else:
            lines = content.split("\n")
            changed = list(compress(range(len(lines)), map(ne, lines, old.lines)))
            if len(changed) > _MAX_CHANGED:
                return None
            varying = sorted({*recent.varying, *changed})
            if len(varying) > _MAX_CHANGED:
                varying = changed
        units = old.units
        line_unit = recent.line_unit
        fired = recent.fired
        if changed:
            # In place: ``fired`` belongs to ``recent`` alone, and a head that is not read
            # against it (None below) replaces it (``_read`` reads afresh and drops ``recent``).
            fires = self.detectors.fires
            for j in changed:
                fired[j] = fires(lines[j])
        affected: dict[int, None] = {}
        for j in changed:
            before, after = old.lines[j], lines[j]
            if "<" in before or "<" in after or not same_shape(before, after):
                return None  # the segmentation, an element or the retrieval block may change
            u = line_unit[j]
            unit = units[u]
            if self.rag_markers and (
                u == old.rag
                or j in (unit.start, unit.start + 1, unit.end - 1)
                or not old.lines[j - 1].strip()
            ):
                return None  # a line the retrieval block is recognised by, or the block itself
            if (recent.counted is None or j in recent.counted) and (
                j == recent.skeleton_line or len(after) >= recent.skeleton_len
            ):
                return None  # the skeleton's line may change
            affected[u] = None
        # Which units a detector fires in stays as it was (else the head is read afresh below):
        # the old head's list is shared, not copied (a head's lists are never mutated).
        detected = old.detected
        texts, hashes = list(old.texts), list(old.hashes)
        for u in affected:
            unit = units[u]
            if any(fired[unit.start : unit.end]) != detected[u]:
                return None  # which lines the skeleton is chosen from changes
            text = unit_text(lines, unit)
            texts[u] = text
            hashes[u] = line_hash(text)
        head = Head(
            lines,
            units,
            texts,
            detected,
            hashes,
            old.rag,
            old.rag_hash,
            old.skeleton,
            old.ambiguous,
            old.rag_blocks,
        )
        if varying is not recent.varying:
            recent.pieces = _pieces(lines, varying)
            recent.varying = varying
        recent.content, recent.head, recent.fired = content, head, fired
        return head
