"""`switchyard route explain | fit | calibrate | eval` on small files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config import parse_policy
from gateway.procutil import free_port
from gateway.routing.resolve import Router

ROOT = Path(__file__).resolve().parents[3]
LABELED = ROOT / "policies" / "examples" / "labeled.jsonl"
BASE = """
deployments:
  f: {base_url: "http://x/v1", price: {input: 0.1, output: 0.4}}
  s: {base_url: "http://x/v1", price: {input: 2.0, output: 8.0}}
tiers: {fast: [f], strong: [s]}
"""


def test_fit_then_eval_agrees_with_the_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fit.yaml"
    assert main(["route", "fit", str(LABELED), "--out", str(out)]) == 0
    block = yaml.safe_load(out.read_text())
    assert block["routing"]["classifier"]["name"] == "linear"
    assert block["routing"]["classifier"]["weights"]["reasoning_cues"] > 0
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(BASE + yaml.safe_dump(block))
    capsys.readouterr()
    assert (
        main(["route", "eval", str(LABELED), "--policy", str(policy_file), "--plot", str(tmp_path / "s.png")])
        == 0
    )
    text = capsys.readouterr().out
    agreement = float(text.split("agreement with the labels: ")[1].split("%")[0])
    assert agreement >= 90
    cost = float(text.split("cost relative to all-strong: ")[1].split("%")[0])
    assert 30 < cost < 80  # about half the requests at 1/20 the price
    assert "<- policy" in text and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_fit_rejects_bad_labels(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}], "label": "medium"}) + "\n")
    with pytest.raises(SystemExit) as info:
        main(["route", "fit", str(bad)])
    assert "label must be 'fast' or 'strong'" in str(info.value)


def test_calibrate_hits_the_requested_strong_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy_file = tmp_path / "p.yaml"
    classifier = (
        "routing:\n  classifier: {bias: -1.6, weights: {reasoning_cues: 3.5, last_user_chars: 1.6}}\n"
    )
    policy_file.write_text(BASE + classifier)
    assert (
        main(["route", "calibrate", str(LABELED), "--strong-share", "0.3", "--policy", str(policy_file)]) == 0
    )
    threshold = yaml.safe_load(capsys.readouterr().out)["routing"]["threshold"]
    router = Router(parse_policy(BASE + classifier + f"  threshold: {threshold}\n", "p"))
    rows = [json.loads(line) for line in LABELED.read_text().splitlines()]
    strong = sum(router.resolve({**row, "model": "auto"}).tier == "strong" for row in rows) / len(rows)
    assert 0.25 <= strong <= 0.35


def test_explain_prints_features_score_and_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(
        BASE + "routing:\n  rules: [{name: tools, when: {has_tools: true}, tier: strong}]\n"
        "  classifier: {bias: -1.0, weights: {reasoning_cues: 4.0}}\n"
    )
    request = tmp_path / "r.json"
    request.write_text(
        json.dumps({"model": "auto", "messages": [{"role": "user", "content": "Prove it, why?"}]})
    )
    assert main(["route", "explain", "--policy", str(policy_file), str(request)]) == 0
    out = capsys.readouterr().out
    assert (
        "reasoning_cues" in out
        and "score: " in out
        and "tier: strong" in out
        and "deployments, in order: s" in out
    )
    request.write_text(
        json.dumps(
            {
                "model": "auto",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "t"}}],
            }
        )
    )
    assert main(["route", "explain", "--policy", str(policy_file), str(request)]) == 0
    assert "rule: tools" in capsys.readouterr().out


def _quality_rows(path: Path) -> None:
    rows = []
    for i in range(90):
        hard = i % 3 == 0
        word = "integral" if hard else "capital"
        prompt = f"Question {i}: what is the {word} of item {i % 7}?"
        rows.append({"id": f"q{i}", "domain": f"d{i % 5}", "bench": "toy" if i % 2 else "other",
                     "prompt": prompt, "weak": 0 if hard else 1, "strong": 1})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_ngram_fit_reports_held_out_quality_then_eval_measures_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "q.jsonl"
    _quality_rows(data)
    weights = tmp_path / "w.json"
    assert (
        main(["route", "fit", str(data), "--classifier", "ngram", "--folds", "3", "--out", str(weights)]) == 0
    )
    out = capsys.readouterr().out
    assert "held-out quality (3 folds" in out and "APGR" in out and "name: ngram" in out
    block = yaml.safe_load(out.split("merge into your policy:\n")[1])
    assert block["routing"]["classifier"]["weights_file"] == str(weights)
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(BASE + yaml.safe_dump(block))
    png = tmp_path / "curve.png"
    assert main(["route", "eval", str(data), "--policy", str(policy_file), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "classifier: ngram" in out and "CPT(50%)" in out and "CPT(80%)" in out
    assert "toy: 45 prompts" in out and "other: 45 prompts" in out
    apgr = float(out.split("APGR")[1].split()[0])
    assert apgr > 0.6  # the word that marks a hard question was learned
    assert "at the policy's threshold" in out and png.read_bytes()[:4] == b"\x89PNG"


def test_explain_names_the_words_that_drove_the_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "r.json"
    request.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Solve the integral of x^2 dx."}]})
    )
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(BASE + "routing:\n  classifier: {name: ngram}\n  threshold: 0.6\n")
    assert main(["route", "explain", "--policy", str(policy_file), str(request), "--top", "30"]) == 0
    out = capsys.readouterr().out
    assert "classifier: ngram" in out and "most telling first" in out
    shown = out.split("most telling first:\n")[1].split("score:")[0]
    ngrams = [line.split()[0] for line in shown.splitlines() if line.startswith("  '")]
    assert len(ngrams) >= 3 and "length" in shown  # words and pairs read from this request
    assert all(gram.strip("'") in "solve the integral of x 0 dx" for gram in ngrams)


def test_eval_on_held_out_folds_refits_the_ngram_classifier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "q.jsonl"
    _quality_rows(data)
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(BASE + "routing:\n  classifier: {name: ngram}\n")
    assert main(["route", "eval", str(data), "--policy", str(policy_file), "--folds", "3"]) == 0
    out = capsys.readouterr().out
    assert "refitted on 3 held-out folds" in out and float(out.split("APGR")[1].split()[0]) > 0.6
    policy_file.write_text(BASE + "routing:\n  classifier: {bias: -1.0, weights: {reasoning_cues: 4.0}}\n")
    with pytest.raises(SystemExit) as info:
        main(["route", "eval", str(data), "--policy", str(policy_file), "--folds", "3"])
    assert "refits the ngram classifier" in str(info.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["route", "eval", "{missing}"],
        ["route", "fit", "{missing}"],
        ["route", "explain", "{missing}"],
        ["route", "calibrate", "{missing}", "--strong-share", "0.3"],
        ["route", "judge", "--pairs", "{missing}"],
    ],
)
def test_a_missing_file_is_one_line_naming_it(argv: list[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(SystemExit) as info:
        main([a.replace("{missing}", missing) for a in argv])
    message = str(info.value)
    assert message == f"switchyard route {argv[1]}: {missing}: No such file or directory"


def test_an_unreachable_redis_is_one_line() -> None:
    with pytest.raises(SystemExit) as info:
        main(["route", "judge", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"])
    message = str(info.value)
    assert message.startswith("switchyard route judge: cannot reach Redis") and "\n" not in message


def test_plot_without_matplotlib_names_the_extra_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    for command in (["eval"], ["fit", "--classifier", "ngram"]):
        with pytest.raises(SystemExit) as info:
            main(["route", *command, str(LABELED), "--plot", str(tmp_path / "q.png")])
        assert "pip install 'switchyard[plot]'" in str(info.value)
    assert not (tmp_path / "q.png").exists()


def test_a_long_fit_shows_its_progress_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "graded.jsonl"
    with rows.open("w") as out:
        for i in range(40):
            hard = i % 3 == 0
            prompt = ("Prove the theorem step by step " if hard else "Say hi ") + str(i)
            out.write(
                json.dumps({"id": str(i), "prompt": prompt, "weak": 0 if hard else 1, "strong": 1}) + "\n"
            )
    assert main(["route", "fit", str(rows), "--classifier", "ngram", "--folds", "2",
                 "--out", str(tmp_path / "w.json")]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "fitting fold 1 of 2" in err and "fitting fold 2 of 2" in err and "fitting on all 40" in err
