"""The routing loop's guards: no fit or comparison on files where strong buys nothing, old and
new policies compared on rows the new one never saw, weights beside the policy, and a quality
file built from RouteLLM's published per-question results."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import load_policy
from gateway.routing.resolve import Router

BASE = """
deployments:
  f: {base_url: "http://x/v1"}
  s: {base_url: "http://x/v1"}
tiers: {fast: [f], strong: [s]}
"""


def _graded(path: Path, rows: int, strong_wins: bool) -> Path:
    with path.open("w") as out:
        for i in range(rows):
            hard = i % 3 == 0
            prompt = ("Prove the theorem step by step " if hard else "Say hi ") + str(i)
            weak, strong = (0, 1) if hard else (1, 1)
            if not strong_wins:
                weak, strong = strong, weak * 0  # the judge prefers the weak answers
            out.write(json.dumps({"id": f"q{i}", "prompt": prompt, "weak": weak, "strong": strong}) + "\n")
    return path


@pytest.mark.parametrize("command", [["fit", "--classifier", "ngram"], ["eval"]])
def test_a_file_where_strong_is_no_better_is_refused(tmp_path: Path, command: list[str]) -> None:
    data = _graded(tmp_path / "inverted.jsonl", 30, strong_wins=False)
    policy = tmp_path / "p.yaml"
    policy.write_text(BASE + "routing:\n  classifier: {name: ngram}\n")
    extra = ["--policy", str(policy)] if command == ["eval"] else ["--out", str(tmp_path / "w.json")]
    with pytest.raises(SystemExit) as info:
        main(["route", command[0], str(data), *command[1:], *extra])
    message = str(info.value)
    assert "strong answers are judged no better than the weak ones" in message
    assert "mean quality strong 0.000, weak 1.000, over 30 rows" in message
    assert not (tmp_path / "w.json").exists()


def test_holdout_rows_are_kept_out_of_the_fit_and_written_for_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _graded(tmp_path / "graded.jsonl", 60, strong_wins=True)
    held = tmp_path / "held.jsonl"
    argv = ["route", "fit", str(data), "--classifier", "ngram", "--out", str(tmp_path / "w.json"),
            "--holdout", "0.3", "--holdout-out", str(held)]  # fmt: skip
    assert main(argv) == 0
    held_ids = [json.loads(line)["id"] for line in held.read_text().splitlines()]
    assert 8 <= len(held_ids) <= 30
    out = capsys.readouterr().out
    assert f"fitted on {60 - len(held_ids)} prompts" in out
    first = held.read_text()
    assert main(argv) == 0 and held.read_text() == first  # the same rows at every run
    with pytest.raises(SystemExit) as info:
        main(argv[:-2])
    assert "--holdout needs --holdout-out" in str(info.value)


def test_a_weights_file_is_read_beside_the_policy_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    data = _graded(tmp_path / "graded.jsonl", 30, strong_wins=True)
    assert main(["route", "fit", str(data), "--classifier", "ngram", "--out", str(folder / "mine.json")]) == 0
    policy = folder / "policy.yaml"
    policy.write_text(BASE + "routing:\n  classifier: {name: ngram, weights_file: mine.json}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_policy(os.path.relpath(policy, elsewhere))
    assert loaded.routing.classifier is not None
    assert Path(loaded.routing.classifier.weights_file or "") == folder / "mine.json"  # type: ignore[attr-defined]
    assert Router(loaded).classifier is not None


def _routellm_layout(root: Path) -> Path:
    """RouteLLM's evals folder layout with a few made-up questions."""
    evals = root / "routellm" / "evals"
    (evals / "mmlu" / "responses").mkdir(parents=True)
    (evals / "gsm8k").mkdir()
    header = ["prompt", "mixtral-8x7b-instruct-v0.1", "gpt-4-1106-preview"]
    with (evals / "mmlu" / "responses" / "mmlu_astronomy.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerow(["Which planet is largest?\nA. Mars\nB. Jupiter\nAnswer:", "True", "True"])
        w.writerow(["Which star is nearest?\nA. Sirius\nB. Sun\nAnswer:", "False", "True"])
        w.writerow(["A leaked question\nA. x\nAnswer:", "True", "False"])
    (evals / "mmlu" / "contaminated_prompts.jsonl").write_text(
        json.dumps({"eval_prompt": "A leaked question\nA. x\nAnswer:"}) + "\n"
    )
    with (evals / "gsm8k" / "gsm8k_responses.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*header, "mixtral-8x7b-instruct-v0.1_response", "gpt-4-1106-preview_response"])
        w.writerow(["Tom has 3 apples and eats one. How many are left?", "False", "True", "3", "2"])
    return evals


def test_import_routellm_builds_the_quality_file_without_contaminated_prompts(tmp_path: Path) -> None:
    evals = _routellm_layout(tmp_path)
    out = tmp_path / "routellm.jsonl"
    assert main(["route", "import-routellm", str(evals), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"bench": "mmlu", "domain": "astronomy", "prompt": "Which planet is largest?\nA. Mars\nB. Jupiter\nAnswer:",
         "weak": 1, "strong": 1, "id": "mmlu-0"},
        {"bench": "mmlu", "domain": "astronomy", "prompt": "Which star is nearest?\nA. Sirius\nB. Sun\nAnswer:",
         "weak": 0, "strong": 1, "id": "mmlu-1"},
        {"bench": "gsm8k", "prompt": "Tom has 3 apples and eats one. How many are left?",
         "weak": 0, "strong": 1, "id": "gsm8k-0"},
    ]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(["route", "import-routellm", str(tmp_path), "--out", str(out)])
    assert "give the routellm/evals folder" in str(info.value)
