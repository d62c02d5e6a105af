"""Volatile content: what changes from one request of a template to the next.

Built-in detectors find dates, times, weekdays, UUIDs, long hex and base64 ids, epoch
timestamps and request ids; a policy adds its own regexes. Lines are the unit: a
system prompt's line that holds one is volatile. Results (with the line's hash, which
the stability model and the cache report use) are memoized per line text, so the
stable lines that every request repeats cost one dictionary lookup.
"""

from __future__ import annotations

import itertools
import re
import zlib
from typing import TypeVar

from gateway.shaping.policy import Detector

_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_WEEKDAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# Each pattern carries its own case rule: the detectors are joined into one regex, and a
# global IGNORECASE would turn base64_id's "has an uppercase letter" into "has a letter".
PATTERNS: dict[Detector, str] = {
    "iso_date": (
        r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
        r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    ),
    "written_date": (
        rf"(?i:\b(?:{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}"
        rf"|\d{{1,2}}(?:st|nd|rd|th)? {_MONTHS},? \d{{4}})\b)"
    ),
    "time": r"(?i:\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]\.?m\.?)?\b)",
    # A weekday is volatile only where it says what day it is ("Today is Friday", "Day:
    # Friday", "Friday, 3 December"); a rule about a weekday ("never deploy on Friday") is not.
    "weekday": (
        rf"(?i:\b(?:today|it|now)(?: is|'s|\u2019s)(?: a)? {_WEEKDAY}\b"
        rf"|\b(?:day|weekday|day of (?:the )?week)\s*[:=]\s*{_WEEKDAY}\b"
        rf"|\b{_WEEKDAY},? (?:\d{{1,2}}(?:st|nd|rd|th)?\b|{_MONTHS}\b))"
    ),
    "uuid": r"(?i:\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b)",
    "hex_id": r"(?i:\b(?=[0-9a-f]*\d)[0-9a-f]{16,}\b)",
    # Random ids mix digits, upper and lower case and have no run of six lowercase letters
    # (a word: model names such as Qwen2-VL-72B-Instruct); a slash ends one (URL paths).
    "base64_id": (
        r"\b(?=[A-Za-z0-9+_-]*\d)(?=[A-Za-z0-9+_-]*[A-Z])(?=[A-Za-z0-9+_-]*[a-z])"
        r"(?![A-Za-z0-9+_-]*[a-z]{6})[A-Za-z0-9+_-]{24,}={0,2}"
    ),
    "epoch": r"\b1[5-9]\d{8}(?:\d{3})?\b",
    # The id must hold a digit: "run_command" and "session_history" are names, not ids.
    "request_id": (
        r"(?i:\b(?:req|request|trace|session|conv|msg|call|run)[_-](?:id[_:=-]?)?"
        r"(?=[A-Za-z]*\d)[A-Za-z0-9]{6,}\b)"
    ),
}
MASK = "<*>"
_FIRES_ORDER: tuple[Detector, ...] = (
    "iso_date", "time", "epoch", "uuid", "hex_id", "request_id", "base64_id", "written_date", "weekday",
)  # fmt: skip
_K = TypeVar("_K")
_T = TypeVar("_T")
_GATE = re.compile(r"[\d-]|(?i:day)")
# What a detector cannot match without (a substring, or for ``weekday`` its word ending): a
# line without it skips the detector's search (a line new to a template costs less).
_NEEDS: dict[Detector, tuple[str, ...] | re.Pattern[str]] = {
    "iso_date": ("-", "/"),
    "time": (":",),
    "uuid": ("-",),
    "request_id": ("_", "-"),
    "weekday": re.compile(r"(?i:day)"),
}


# The built-in detectors tell digits apart only as these classes: ``1`` (epoch's leading
# digit), ``5``-``9`` (epoch's second) and the rest (every other use is ``\d`` or a class
# holding all ten). A line with its ASCII digits so reduced fires exactly where it does.
_DIGIT_CLASSES = bytes.maketrans(b"0123456789", b"0100055555")  # over UTF-8: digits are ASCII bytes


def keep(memo: dict[_K, _T], key: _K, value: _T, kept: int) -> _T:
    """Put ``value`` in a memo of at most ``kept`` entries (a new key past that drops the
    oldest eighth first: finding the oldest entry costs more with each one deleted before
    it, until the dict is rebuilt); returns ``value``."""
    if len(memo) >= kept and key not in memo:
        for old in list(itertools.islice(memo, max(1, kept // 8))):
            del memo[old]
    memo[key] = value
    return value


def _newer_half(memo: dict[_K, _T]) -> dict[_K, _T]:
    """The newer half of a full memo (dropped at once: deleting the oldest entry one by one
    makes finding the next oldest cost more with each deletion)."""
    return dict(itertools.islice(memo.items(), len(memo) // 2, None))


class Detectors:
    """The compiled detectors of one policy, with a bounded memo per line."""

    def __init__(self, detectors: list[Detector], extra: list[str], memo_size: int = 20_000) -> None:
        # A policy's own regexes match ignoring case, as they always have.
        sources = [PATTERNS[d] for d in detectors] + [f"(?i:{x})" for x in extra]
        self._regex = re.compile("|".join(f"(?:{s})" for s in sources)) if sources else None
        self._memo: dict[str, tuple[bool, str, str]] = {}
        self._memo_size = memo_size
        # For :meth:`fires`: each detector alone (the likeliest first), each stopping at its
        # first match, instead of the alternation tried at every position.
        order = [d for d in _FIRES_ORDER if d in detectors]
        self._singles = [(_NEEDS.get(d), re.compile(PATTERNS[d])) for d in order]
        self._extra = [re.compile(f"(?i:{x})") for x in extra]
        # What :meth:`fires` found (for the built-in detectors), by the line and by its bytes
        # with the digits reduced to the classes the detectors tell apart (a time or an id
        # with other digits reads the same).
        self._fired: dict[str, bool] = {}
        self._fired_classes: dict[bytes, bool] = {}

    def fires(self, text: str) -> bool:
        """Whether a detector fires in ``text`` (what :meth:`line` says first; a new line costs
        a search that stops at the first match, not a masking pass over the whole line)."""
        found = self._memo.get(text)
        if found is not None:
            return found[0]
        if self._extra and any(p.search(text) for p in self._extra):
            return True  # a policy's own regex may tell any digit apart: not memoized
        fired = self._fired.get(text)
        if fired is None:
            key = text.encode("utf-8", "surrogatepass").translate(_DIGIT_CLASSES)
            fired = self._fired_classes.get(key)
            if fired is None:
                # Every built-in detector needs a digit, a hyphen (a UUID of letters) or "day".
                fired = _GATE.search(text) is not None and self._single_fires(text)
                if len(self._fired_classes) >= self._memo_size:
                    self._fired_classes = _newer_half(self._fired_classes)
                self._fired_classes[key] = fired
            if len(self._fired) >= self._memo_size:
                self._fired = _newer_half(self._fired)
            self._fired[text] = fired
        return fired

    def _single_fires(self, text: str) -> bool:
        """Whether one of the built-in detectors matches in ``text`` (skipping those it cannot)."""
        for needs, pattern in self._singles:
            if needs is not None:
                if isinstance(needs, tuple):
                    if not any(needed in text for needed in needs):
                        continue
                elif needs.search(text) is None:
                    continue
            if pattern.search(text):
                return True
        return False

    def line(self, text: str) -> tuple[bool, str, str]:
        """``(volatile, masked, hash)`` for one line: whether a detector fires, the line with
        every match replaced by ``<*>`` (the template skeleton is built from masked lines),
        and :func:`line_hash` of the line."""
        memo = self._memo
        found = memo.get(text)
        if found is not None:
            return found
        if self._regex is None or not text or not self.fires(text):
            # Nothing matches (:meth:`fires` says so at less cost, memoized by digit classes):
            # the masking pass would leave the text as it is.
            found = (False, text, line_hash(text))
        else:
            masked, hits = self._regex.subn(MASK, text)
            found = (hits > 0, masked, line_hash(text))
        memo[text] = found
        if len(memo) > self._memo_size:
            self._memo = _newer_half(memo)
        return found


def line_hash(line: str) -> str:
    """A line's identity in the stability counts and the segment signatures (CRC-32, hex)."""
    return f"{zlib.crc32(line.encode('utf-8', 'surrogatepass')):08x}"
