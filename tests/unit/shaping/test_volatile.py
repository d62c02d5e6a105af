"""Each volatility detector: what it must find, and the stable text it must leave alone."""

from __future__ import annotations

import pytest

from gateway.shaping.policy import DETECTORS, Detector
from gateway.shaping.volatile import Detectors, keep

CASES: dict[Detector, tuple[list[str], list[str]]] = {
    "iso_date": (
        ["Today's date: 2026-12-03", "Now 2026-12-03T10:42:07.123Z", "Date: 12/03/2026"],
        ["Use API version v2.3.1.", "Ratio 16:9 screens are common.", "Python 3.12 or later."],
    ),
    "written_date": (
        ["It is December 3, 2026.", "Today: 3rd Dec 2026"],
        ["Reports are due in December.", "May I help you?", "The March release added tools."],
    ),
    "time": (
        ["Local time: 10:42", "It is 7:05 pm."],
        ["Read Genesis chapter three.", "Use a 4-space indent.", "Port 8080 serves the API."],
    ),
    "weekday": (
        ["Today is Friday.", "It's a Monday", "Day: Thursday", "Thursday, 3 December", "Sunday, Dec 6"],
        ["Do not deploy on Friday.", "The warehouse is closed on Sunday.", "Standups are on Mondays."],
    ),
    "uuid": (
        ["Session 123e4567-e89b-12d3-a456-426614174000"],
        ["Use the uuid module to make ids.", "A UUID has 36 characters."],
    ),
    "hex_id": (
        ["Trace 9f86d081884c7d659a2feaa0c55ad015", "commit 4b825dc642cb6eb9a060e54bf8d69288fbee4904"],
        ["Colours: #ffcc00 and #abcdef.", "The word facade is not an id."],
    ),
    "base64_id": (
        ["Token dGhpc0lzQVZlcnlMb25nVG9rZW4xMjM0NTY3", "key sk-AbC9dEf8GhI7jKl6MnO5pQr4"],
        [
            "Model: Qwen2-VL-72B-Instruct-GPTQ-Int4",
            "Use meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo for long prompts.",
            "Docs: https://docs.example.com/api/v2/ReferenceGuide/chatCompletions2024",
            "Call getUserProfileByAccountId2 for the profile.",
        ],
    ),
    "epoch": (["Epoch 1764720000", "ts=1764720000123"], ["Budget: 150 tokens.", "Max 25000 rows."]),
    "request_id": (
        ["request_id=req_8f3kd92la", "trace-id: trace_A1b2C3d4", "Session: session-7f3a9c21"],
        [
            "Use run_command to run shell commands.",
            "Call session_history for earlier turns.",
            "The msg_format option picks markdown.",
        ],
    ),
}


def test_every_detector_has_cases() -> None:
    assert set(CASES) == set(DETECTORS)


@pytest.mark.parametrize("detector", list(CASES))
def test_a_detector_finds_its_values_and_nothing_else(detector: Detector) -> None:
    must, must_not = CASES[detector]
    alone = Detectors([detector], [])
    everyone = Detectors(list(DETECTORS), [])
    for line in must:
        assert alone.line(line)[0], f"{detector} missed {line!r}"
    for line in must_not:
        assert not alone.line(line)[0], f"{detector} fired on {line!r}"
        assert not everyone.line(line)[0], f"a detector fired on {line!r}"


def test_a_policy_regex_still_ignores_case() -> None:
    assert Detectors([], [r"customer tier: \w+"]).line("Customer Tier: GOLD")[0]


def test_a_full_memo_drops_its_oldest_entries_and_keeps_the_newest() -> None:
    memo: dict[int, int] = {}
    for key in range(1000):
        assert keep(memo, key, key * 2, 64) == key * 2
        assert len(memo) <= 64
        assert memo[key] == key * 2
    assert list(memo) == sorted(memo)  # the oldest went first
    assert set(range(1000 - 56, 1000)) <= set(memo)  # at least the newest seven eighths stay
    keep(memo, 999, 0, 64)  # a key already held is replaced: nothing is dropped for it
    assert memo[999] == 0 and 998 in memo
