"""Which units of a head move: their verdicts (the detectors, the learned counts), the layout
the conversation had, and the template's last first-request decision.

A conversation's first request (all a single-turn app ever sends) has no layout to follow:
its units are decided by their verdicts alone. A template's first requests mostly differ
only in a few values (a time, a name) whose units read as before, so the last one's decision
per template is kept and reused when everything it was made from is the same: the
segmentation (the very same units), the detectors' findings, the learned verdicts (list
compares: a verdict is a bool, compared by identity), whether the units the counts find
volatile are blank, and whether per-request content may go late. What it saves is a pass of
Python over every unit (the verdicts turned into moves, the late units, the placement's
memo key); the counts are still read and updated as on every request.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import not_
from typing import Any, NamedTuple

from gateway.shaping.body import _has_history
from gateway.shaping.heads import Head
from gateway.shaping.layout import UnitPlacement, _Placed
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.replay import ConversationMemo, _has_hash, _Layout
from gateway.shaping.stability import StabilityModel
from gateway.shaping.units import Unit
from gateway.shaping.volatile import keep
from gateway.store.writer import StatsWriter

_FIRSTS_KEPT = 256  # templates whose last first-request decision is kept


class _First(NamedTuple):
    """A template's last first-request decision and what it was made from (see the module)."""

    units: list[Unit]
    detected: list[bool]
    learned: list[bool | None] | None
    volatile: list[int]
    """The units the counts found volatile (``learned`` False)."""
    filled: list[bool]
    """Per unit of ``volatile``, whether it is not blank (a blank one carries nothing: it stays)."""
    late_ok: bool
    rag: int
    ambiguous: bool
    rag_blocks: tuple[int, ...]
    placed: _Placed


class Decisions(UnitPlacement, ConversationMemo):
    """:class:`~gateway.shaping.shaper.PolicyShaper`'s decision of what moves (a mixin: the
    shaper holds its state)."""

    policy: ShapingPolicy
    _firsts: dict[str, _First]

    def _learned(
        self,
        template: str,
        hashes: list[str],
        stability: StabilityModel | None,
        writer: StatsWriter | None,
    ) -> list[bool | None] | None:
        """The counts' verdict per unit (None: not learning, or not known yet), read before
        this request is counted."""
        policy = self.policy
        if stability is None or not policy.learn:
            return None
        learned = stability.verdicts(template, hashes, policy.learn_min_requests, policy.stable_share)
        stability.observe(template, hashes, writer)
        if not learned or learned[0] is None:  # not known yet: for all of them, or none
            return None
        return learned

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
        return _moving_from(self._learned(template, hashes, stability, writer), texts, detected)

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
        learned = self._learned(template, hashes, stability, writer)
        if previous is None:
            # A conversation's first request: decided by the verdicts alone, as the template's
            # last first request was when they are the same.
            late_ok = at >= 0 and _has_history(messages, at)
            first = self._firsts.get(template)
            if (
                first is not None
                and first.units is units
                and first.detected == detected
                and first.learned == learned
                and first.late_ok == late_ok
                and first.rag == rag
                and first.ambiguous == ambiguous
                and first.rag_blocks == rag_blocks
                and [bool(texts[i].strip()) for i in first.volatile] == first.filled
            ):
                return first.placed
        moving = _moving_from(learned, texts, detected)
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
        placed = self._placed(units, lines, texts, moving, late, rag, rag_kept)
        if previous is None:
            volatile = [] if learned is None else [i for i, v in enumerate(learned) if not v]
            entry = _First(
                units,
                detected,
                learned,
                volatile,
                [bool(texts[i].strip()) for i in volatile],
                late_ok,
                read.rag,
                ambiguous,
                rag_blocks,
                placed,
            )
            keep(self._firsts, template, entry, _FIRSTS_KEPT)
        return placed


def _moving_from(
    learned: list[bool | None] | None, texts: Sequence[str | None], detected: list[bool]
) -> list[bool]:
    """Per unit, whether it moves by its verdict: the detectors' until the counts are known
    (``learned`` None), then the counts' (a blank unit or a non-text part stays)."""
    if learned is None:
        return list(detected)  # a copy: the caller changes it, the head's list is shared
    moving = list(map(not_, learned))
    for i in list(compress(range(len(moving)), moving)):  # the few the counts find volatile
        text = texts[i]
        moving[i] = text is not None and bool(text.strip())
    return moving
