"""Where a head's units go once their verdicts are known: the order of those staying, those
moving to the end of the system message or into a message of their own, the retrieval
block's place, and the checks that no unit reads as part of another in its new place."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from itertools import compress
from operator import not_
from typing import Any

from gateway.shaping.body import _has_history
from gateway.shaping.result import ShapeResult
from gateway.shaping.units import (
    ELEMENT,
    FENCE,
    ITEM,
    LEAD_IN,
    LINES,
    SECTION,
    TEXT,
    Unit,
    glued,
    level,
    line_kind,
    segment_cached,
    self_contained,
)

_Placed = tuple[list[int], list[int], list[int], int, list[bool]]
"""What :meth:`PolicyShaper._placed` decides: (order, end_idx, late_idx, rag, moving)."""


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


class UnitPlacement:
    """:class:`~gateway.shaping.shaper.PolicyShaper`'s placement decision and its memos (a
    mixin: the shaper holds its state)."""

    _whole: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[list[Unit], bool]]
    _placements: dict[tuple[int, bytes, bytes, int, int], tuple[list[Unit], _Placed]]
    _kinds: dict[int, tuple[list[Unit], dict[int, str]]]

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
        tail = _tail_chain(units, lines)
        if len(tail) == 2 and (moving[tail[0]] or late[tail[1]]) and _ends_after_section(units, lines, tail):
            # A sentence that ends the text after the final section reads as part of it to
            # anyone but the segmenter: it goes where the section goes, and never alone into
            # a message of its own.
            section, sentence = tail
            late = list(late)
            if moving[section]:
                moving[sentence], late[sentence] = True, late[section]
            else:
                late[sentence] = False
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
        end_idx = [i for i in end_idx if lines[units[i].start].strip()]  # blank lines are no move
        if end_idx:
            if at < 0:
                why = "placement"
            elif _has_history(messages, at):
                why = "same within the conversation"
            else:
                why = "first turn"
            moves += [(self._kind(units, lines, i), why, "end") for i in end_idx]
        for i in late_idx:
            if i == rag_unit:
                moves.append(("retrieved", "retrieved anew", result.late_at))
            else:
                moves.append((self._kind(units, lines, i), "changes within the conversation", result.late_at))
        return moves

    def _kind(self, units: list[Unit], lines: list[str], i: int) -> str:
        """:func:`_unit_kind` of unit ``i``, memoized by the segmentation: what it reads of the
        lines (their kinds) is part of their shapes, and ``units`` is shared by every text of
        the same line shapes (:func:`~gateway.shaping.units.segment_cached`)."""
        memo = self._kinds.get(id(units))
        if memo is None or memo[0] is not units:
            if len(self._kinds) > 1024:
                self._kinds.clear()
            memo = self._kinds[id(units)] = (units, {})
        kind = memo[1].get(i)
        if kind is None:
            kind = memo[1][i] = _unit_kind(units[i], lines)
        return kind


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
        chain = [before, *compress(range(len(end)), end)]
        if _chain_joins(units, lines, chain):
            if rag < 0 and _ends_after_section(units, lines, chain):
                # The sentence ends the text after the final section; the blank lines that
                # ended the text stay after it (in ``end``, not moving: they are no move), so
                # a sentence already there keeps its bytes and a shaped text reads back alike.
                for i in stable[last_nonblank + 1 :]:
                    end[i] = True
                return stable[: last_nonblank + 1], -1
            for i, e in enumerate(end):
                if e:
                    moving[i] = end[i] = False
            return _place(units, lines, moving, end, rag)
    if rag < 0:
        return stable, -1
    last = nonblank[-1] if nonblank else -1
    return [*stable[: last + 1], rag, *stable[last + 1 :]], rag


def _ends_after_section(units: list[Unit], lines: list[str], chain: list[int]) -> bool:
    """Whether ``chain`` is a final section and one self-contained sentence (one line that
    names what it is, "The current date is ..."): the sentence may end the system message
    after the section, where it reads back as its own unit (see
    :func:`~gateway.shaping.units.segment`). A list item, a record's field, a lead-in's line or
    a line referring to its neighbours is no such sentence."""
    if len(chain) != 2:
        return False
    section, sentence = units[chain[0]], units[chain[1]]
    if section.kind != SECTION or section.end - section.start < 2 or sentence.kind != LINES:
        return False
    line = lines[sentence.start]
    if sentence.end != sentence.start + 1 or line_kind(line) != TEXT or not self_contained(line):
        return False
    last = lines[section.end - 1]
    return not glued(last, line_kind(last), line, TEXT)


def _tail_chain(units: list[Unit], lines: list[str]) -> list[int]:
    """The text's last two units that are not blank (for :func:`_ends_after_section`)."""
    found: list[int] = []
    for i in range(len(units) - 1, -1, -1):
        if lines[units[i].start].strip():
            found.insert(0, i)
            if len(found) == 2:
                break
    return found


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
