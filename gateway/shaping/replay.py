"""What shaping remembers per conversation: the layout of its last request's head (what moved,
what stayed), and the replay that decides a conversation's next request at the cost of the
units that changed since."""

from __future__ import annotations

from itertools import compress
from operator import is_not
from typing import Any, NamedTuple

import orjson

from gateway.shaping.body import _HEAD_ROLES, _has_history
from gateway.shaping.heads import Head
from gateway.shaping.policy import ShapingPolicy
from gateway.shaping.stability import StabilityModel
from gateway.shaping.volatile import keep
from gateway.store.writer import StatsWriter

_SAME_HISTORY_KEPT = 4  # heads kept per history (sessions of several users that open alike)
_PREDECESSORS_TRIED = 3  # answers from the newest back whose prefix is looked up
# Conversations whose last request's head is kept (with its stable text: as many as the
# head reader keeps heads, gateway.shaping.heads).
_REPLAYS_KEPT = 512
_REPLAY_MAX_CHANGED = 16  # more units changed than this: decide afresh


class _Layout(NamedTuple):
    """A conversation's last request's head: the hashes of the units that moved, and of those
    that stayed (concatenated, 8 characters each: a string costs less than a set). A tuple:
    one is made per request, and a frozen dataclass costs a call per field."""

    moved: frozenset[str]
    stable: str


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


def _has_hash(joined: str, h: str) -> bool:
    """Whether ``h`` is one of the 8-character hashes concatenated in ``joined``."""
    at = joined.find(h)
    while at >= 0:
        if at % 8 == 0:
            return True
        at = joined.find(h, at + 1)
    return False


class ConversationMemo:
    """:class:`~gateway.shaping.shaper.PolicyShaper`'s memory of conversations under way (a
    mixin: the shaper holds its state)."""

    policy: ShapingPolicy
    _conversations: dict[str, list[_Layout]]
    _replays: dict[str, _Replay]
    _read_hashes: list[str]

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

    def _layout(self, messages: list[Any], template: str) -> tuple[tuple[str, ...], _Layout | None, str]:
        """The keys this request's head is remembered by, what the request it continues left
        (None: it continues none this shaper saw) and that request's key.

        A request continues the one whose turns (the messages after the head) are a prefix of
        its own up to the newest answer: a chat turn adds an answer and a user message, an
        agent step an answer with tool calls and their results. It is remembered by its own
        turns and by those before its newest answer: a retry, or an edit of the newest
        message, continues what its sibling continued. Several users' sessions often open
        with the same first message (the same task, "Hi!"): their first requests share a key,
        and the one continued is the one whose head has the most units in common with this
        head (the other users' names and directories differ)."""
        own, candidates = _history_keys(messages)
        if own is None:
            return (), None, ""
        keys = (f"{template}:{own}", f"{template}:{candidates[0]}") if candidates else (f"{template}:{own}",)
        for h in candidates:
            prev_key = f"{template}:{h}"
            found = self._conversations.get(prev_key)
            if found:
                return keys, (found[-1] if len(found) == 1 else _closest(found, self._read_hashes)), prev_key
        return keys, None, ""

    def _remember(
        self,
        keys: tuple[str, ...],
        hashes: list[str],
        moving: list[bool],
        stable: str,
        previous: _Layout | None = None,
    ) -> _Layout:
        """Keep this request's layout under its history keys (a few per key: users whose
        sessions open alike); it replaces ``previous``, the request it continued, there."""
        conversations = self._conversations
        if len(conversations) > 10_000:
            conversations.clear()
        layout = _Layout(frozenset(compress(hashes, moving)), stable)
        for key in keys:
            found = conversations.get(key)
            if found is None:
                conversations[key] = [layout]
            else:
                if previous is not None and previous in found:
                    found.remove(previous)
                found.append(layout)
                del found[:-_SAME_HISTORY_KEPT]
        return layout

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
        keys: tuple[str, ...],
        layout: _Layout,
        hashes: list[str],
        moving: list[bool],
        stable_idx: list[int],
        stable: tuple[str, str, bytes, bool],
    ) -> None:
        """Keep what :meth:`_replayed` needs for the conversation's next request."""
        # Nothing moved (a conversation's first request, mostly): clean without a look.
        clean = not layout.moved or layout.moved.isdisjoint(map(hashes.__getitem__, stable_idx))
        replay = _Replay(layout, hashes, moving, clean, stable_idx, stable)
        for key in keys:
            keep(self._replays, key, replay, _REPLAYS_KEPT)


_LONG_TEXT = 2048  # a turn this long is hashed once and then found by a compare
_LONG_KEPT = 512
_long_hashes: dict[tuple[int, str, str], list[tuple[str, int]]] = {}


def _text_key(text: str) -> int:
    """``hash(text)``; a long turn (a pasted file, a repo map) comes back in every request of
    its conversation as a new string: its hash is remembered and found by its length and
    ends, then a compare (memcmp speed; hashing 15 KB costs ~10 µs)."""
    if len(text) < _LONG_TEXT:
        return hash(text)
    sample = (len(text), text[:64], text[-64:])
    bucket = _long_hashes.get(sample)
    if bucket is not None:
        for seen, h in bucket:
            if seen == text:
                return h
    h = hash(text)
    if bucket is None:
        bucket = keep(_long_hashes, sample, [], _LONG_KEPT)
    bucket.insert(0, (text, h))
    del bucket[2:]
    return h


def _message_key(message: Any) -> int:
    """A turn's hash (the process's own: conversations are remembered per process)."""
    if isinstance(message, dict):
        content = message.get("content")
        if isinstance(content, str):
            if len(message) == 2:
                return hash((message.get("role"), _text_key(content)))
            # A tool result (its call id), a named message: the text as above, the rest by JSON.
            rest = orjson.dumps({k: v for k, v in message.items() if k != "content"})
            return hash((_text_key(content), rest))
    return hash(orjson.dumps(message))


def _history_keys(messages: list[Any]) -> tuple[int | None, list[int]]:
    """The hash of the request's turns (the messages after the head; None without a user
    message) and the hashes of the prefixes a previous request of its conversation would
    have sent: the turns before each answer, from the newest back."""
    start = 1 if messages and isinstance(messages[0], dict) and messages[0].get("role") in _HEAD_ROLES else 0
    keys: list[int] = []
    answers: list[int] = []  # the turns that are answers (not the first turn)
    for i, message in enumerate(messages[start:]):  # one pass: keys and answers
        keys.append(_message_key(message))
        if i and isinstance(message, dict) and message.get("role") == "assistant":
            answers.append(i)
    if not keys:
        return None, []
    candidates = [hash(tuple(keys[:i])) for i in reversed(answers[-_PREDECESSORS_TRIED:])]
    return hash(tuple(keys)), candidates


def _closest(layouts: list[_Layout], hashes: list[str]) -> _Layout:
    """Of requests with the same turns, the one whose head shares the most units with this
    head (the newest on a tie)."""
    best, best_score = layouts[-1], -1
    for layout in reversed(layouts):
        stable = layout.stable
        kept = {stable[i : i + 8] for i in range(0, len(stable), 8)} | layout.moved
        score = sum(map(kept.__contains__, hashes))
        if score > best_score:
            best, best_score = layout, score
    return best
