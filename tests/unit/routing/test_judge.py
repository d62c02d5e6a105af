"""`route judge`'s pieces: the strict grade parser, the A/B order, the rows it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config import PolicyError, parse_policy
from gateway.routing.learn.judge import (
    GRADES_SCHEMA,
    a_is_fast,
    escalation_row,
    graded_row,
    judge_request,
    parse_grades,
)
from gateway.routing.loop_policy import Judge

PAIR = {
    "v": 1,
    "kind": "shadow",
    "id": "req-1",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "score": 0.31,
    "fast": {"deployment": "a", "content": "5", "tool_calls": None, "finish_reason": "stop"},
    "strong": {"deployment": "b", "content": "4", "tool_calls": None, "finish_reason": "stop"},
}


@pytest.mark.parametrize(
    ("content", "grades"),
    [
        ('{"score_a": 2, "score_b": 5}', (2, 5)),
        ('  {"score_b": 1, "score_a": 4}\n', (4, 1)),
        ('```json\n{"score_a": 2, "score_b": 5}\n```', None),
        ('{"score_a": 2}', None),
        ('{"score_a": 2, "score_b": 5, "why": "x"}', None),
        ('{"score_a": 0, "score_b": 5}', None),
        ('{"score_a": 2.0, "score_b": 5}', None),
        ('{"score_a": true, "score_b": 5}', None),
        ('{"score_a": "2", "score_b": 5}', None),
        ("A is better", None),
        ("[2, 5]", None),
        (None, None),
    ],
)
def test_grades_are_parsed_strictly_never_guessed(content: object, grades: tuple[int, int] | None) -> None:
    assert parse_grades(content) == grades


def test_the_answer_order_is_stable_per_pair_and_mixed_over_pairs() -> None:
    assert a_is_fast("req-1") == a_is_fast("req-1")
    firsts = [a_is_fast(f"req-{i}") for i in range(200)]
    assert 60 < sum(firsts) < 140


def test_a_judged_pair_maps_grades_back_to_the_tiers() -> None:
    row = graded_row(PAIR, (2, 5), "judge")
    fast_grade, strong_grade = (2, 5) if a_is_fast("req-1") else (5, 2)
    assert row["weak"] == (fast_grade - 1) / 4 and row["strong"] == (strong_grade - 1) / 4
    assert row["judge"] == {"deployment": "judge", "weak": fast_grade, "strong": strong_grade}
    assert row["messages"] == PAIR["messages"] and row["bench"] == "shadow" and row["id"] == "req-1"


def test_the_judge_request_carries_rubric_both_answers_and_the_schema() -> None:
    body = judge_request(PAIR, Judge(deployment="judge", max_chars=500))
    assert body["model"] == "judge" and body["temperature"] == 0
    assert body["response_format"]["json_schema"]["schema"] == GRADES_SCHEMA
    system, user = body["messages"]
    assert "1 to 5" in system["content"]
    text = user["content"]
    a, b = ("5", "4") if a_is_fast("req-1") else ("4", "5")
    assert f"## Answer A\n{a}\n" in text and text.endswith(f"## Answer B\n{b}")
    assert "[user] What is 2 + 2?" in text


def test_long_parts_are_cut_to_head_and_tail() -> None:
    long = dict(PAIR, messages=[{"role": "user", "content": "x" * 3000 + "TAIL"}])
    text = judge_request(long, Judge(deployment="judge", max_chars=1000))["messages"][1]["content"]
    assert "characters left out" in text and "TAIL" in text and len(text) < 1500


def test_an_escalation_is_labelled_by_its_check() -> None:
    row = escalation_row(dict(PAIR, kind="escalation", reason="empty", strong_passed=True))
    assert (row["weak"], row["strong"], row["bench"], row["reason"]) == (0.0, 1.0, "escalation", "empty")
    row = escalation_row(dict(PAIR, kind="escalation", reason="empty", strong_passed=False))
    assert row["strong"] == 0.0


BASE = """
deployments:
  a: {base_url: "http://127.0.0.1:9/v1"}
tiers: {fast: [a], strong: [a]}
"""


def test_the_judge_must_be_a_deployment_of_the_policy() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(BASE + "routing:\n  judge: {deployment: nope}\n", "p")
    assert "routing.judge.deployment" in str(info.value) and "unknown deployment 'nope'" in str(info.value)


def test_escalations_need_no_judge_but_shadow_pairs_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(dict(PAIR, kind="escalation", reason="length", strong_passed=True)) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["route", "judge", "--pairs", str(pairs), "--policy", str(policy), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["weak"], r["strong"]) for r in rows] == [(0.0, 1.0)]
    assert "1 escalations" in capsys.readouterr().err
    pairs.write_text(json.dumps(PAIR) + "\n")
    with pytest.raises(SystemExit) as info:
        main(["route", "judge", "--pairs", str(pairs), "--policy", str(policy), "--out", str(out)])
    assert "routing.judge" in str(info.value)


def test_calibrate_writes_its_target_with_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE + "routing:\n  classifier: {bias: -1.6, weights: {reasoning_cues: 3.5}}\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"why {i} " * i}) + "\n" for i in range(20)))
    assert main(["route", "calibrate", str(prompts), "--strong-share", "0.25", "--policy", str(policy)]) == 0
    block = yaml.safe_load(capsys.readouterr().out)["routing"]
    assert block["calibration"] == {"strong_share": 0.25} and 0 <= block["threshold"] <= 1
    # ... and the block merges into a valid policy.
    assert (
        parse_policy(BASE + yaml.safe_dump({"routing": block}), "p").routing.calibration.strong_share == 0.25
    )
