"""The ``ngram`` classifier: words, stable hashes, the logit, the weights file, the fit."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

import gateway.routing.classifiers.ngram as ngram_module
from gateway.config import PolicyError, parse_policy
from gateway.routing.classifiers.ngram import (
    DEFAULT_WEIGHTS,
    MAX_WORDS,
    Ngram,
    NgramModel,
    key_hash,
    keys,
    words,
)
from gateway.routing.features import extract
from gateway.routing.learn.ngram_fit import FitOptions, cross_validated_scores, fit, fold_of, target
from gateway.routing.resolve import Router
from gateway.routing.thresholds import threshold_for_share

BASE = """
deployments:
  f: {base_url: "http://x/v1"}
  s: {base_url: "http://x/v1"}
tiers: {fast: [f], strong: [s]}
"""


def _features(text: str):  # type: ignore[no-untyped-def]
    return extract({"messages": [{"role": "user", "content": text}]})


def test_words_fold_case_and_digits_and_split_at_punctuation() -> None:
    assert words("What is 12.5% of X? Don't f(x)=naïve_b") == [
        "what", "is", "00", "0", "of", "x", "don", "t", "f", "x", "naïve", "b",
    ]  # fmt: skip


def test_hashes_are_crc32_stable_across_processes() -> None:
    assert key_hash("hello") == zlib.crc32(b"hello")
    assert key_hash(("hello", "world")) == zlib.crc32(b"hello world") == 0x0D4A1185


def test_logit_is_the_sum_over_unigrams_and_bigrams_scaled_by_their_count() -> None:
    model = NgramModel(
        bias=-1.0,
        shape={},
        table={key_hash("prove"): 2.0, key_hash(("prove", "theorem")): 1.0},
        about={},
    )
    clf = Ngram(model)
    expected = 1 / (1 + math.exp(-(-1.0 + 3.0 / math.sqrt(3))))  # 2 words + 1 pair
    assert clf.strong_probability(_features("Prove theorem")) == pytest.approx(expected)
    assert clf.strong_probability(_features("Prove theorem")) == pytest.approx(expected)  # memoized
    parts = dict(clf.explain(_features("Prove theorem")))
    assert parts["'prove'"] == pytest.approx(2 / math.sqrt(3))
    assert parts["'prove theorem'"] == pytest.approx(1 / math.sqrt(3))
    assert parts["bias"] == -1.0


def test_the_memo_gives_every_word_and_pair_its_own_weight_once() -> None:
    # The memo folds each pair's second word into the pair's entry; the logit must stay the
    # plain sum over every unigram and bigram, repeated words and an empty message included.
    table = {key_hash(k): 0.1 * (i + 1) for i, k in enumerate(["a", "b", ("a", "b"), ("b", "a"), "c"])}
    clf = Ngram(NgramModel(0.0, {}, table, {}))
    for tokens in ([], ["a"], ["b", "a"], ["a", "b", "a", "b", "c", "zz"], ["zz", "a", "zz"]):
        expected = sum(table.get(key_hash(k), 0.0) for k in keys(tokens))
        scale = math.sqrt(max(1, 2 * len(tokens) - 1))
        assert clf.ngram_logit(tokens) == pytest.approx(expected / scale)
        assert clf.ngram_logit(tokens) == pytest.approx(expected / scale)  # from the memo


def test_a_message_seen_before_scores_as_when_first_seen_and_the_memo_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An agent's tool loop sends one last user message with every step: its score comes from
    # the per-message memo, which must give what reading the words gives, and stay bounded.
    monkeypatch.setattr(ngram_module, "_TEXT_MEMO_LIMIT", 3)
    table = {key_hash("prove"): 2.0, key_hash(("prove", "theorem")): 1.0, key_hash("hello"): -0.5}
    clf = Ngram(NgramModel(0.0, {}, table, {}))
    texts = ["Prove theorem", "hello", "nothing known", "prove it", "Hello hello", "Prove theorem"]
    for text in texts + texts:
        assert clf.text_logit(text) == pytest.approx(clf.ngram_logit(words(text)))
        assert len(clf._texts) <= 3
    assert clf.text_logit("nothing known") == 0.0


def test_length_term_is_centred() -> None:
    model = NgramModel(0.0, {}, {}, {}, length_weight=0.5, length_center=math.log1p(100))
    clf = Ngram(model)
    assert clf.strong_probability(_features("x" * 100)) == pytest.approx(0.5)
    assert clf.strong_probability(_features("x " * 500)) > 0.5


MCQ = "Which gas do plants take in?\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:"


def test_alike_answer_options_lean_strong_and_text_without_options_is_untouched() -> None:
    model = NgramModel(0.0, {}, {}, {}, options_weight=2.0, options_center=0.3)
    clf = Ngram(model)
    alike = _features(MCQ.format(a="carbon dioxide", b="carbon monoxide", c="carbon", d="dioxide"))
    apart = _features(MCQ.format(a="oxygen", b="nitrogen", c="helium", d="water vapour"))
    assert clf.strong_probability(alike) > 0.5 > clf.strong_probability(apart)
    plain = _features("Which gas do plants take in?\nThey take in one gas.")
    assert clf.strong_probability(plain) == 0.5
    # route explain names the term
    parts = dict(clf.explain(alike))
    assert parts["options alike"] == pytest.approx(clf.text_logit(alike.text))
    assert "options alike" not in dict(clf.explain(plain))


def test_weights_file_round_trip(tmp_path: Path) -> None:
    model = NgramModel(
        0.25, {"code_density": 0.5}, {1: 0.5, 2**32 - 1: -1.25}, {"examples": 3}, 0.5, 5.0, 2.0, 0.34
    )
    path = tmp_path / "w.json"
    model.dump(path)
    back = NgramModel.load(path)
    assert back.bias == 0.25 and back.shape == {"code_density": 0.5} and back.about == {"examples": 3}
    assert back.table[1] == pytest.approx(0.5, abs=1e-4) and back.table[2**32 - 1] == pytest.approx(-1.25)
    assert (back.length_weight, back.length_center) == (0.5, 5.0)
    assert (back.options_weight, back.options_center) == (2.0, 0.34)


def test_a_weights_file_from_before_the_options_term_loads_without_it(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    NgramModel(0.0, {}, {1: 0.5}, {}).dump(path)
    doc = json.loads(path.read_text())
    del doc["options_weight"], doc["options_center"]
    path.write_text(json.dumps(doc))
    assert NgramModel.load(path).options_weight == 0.0


def test_policy_selects_the_shipped_weights_or_a_file(tmp_path: Path) -> None:
    router = Router(parse_policy(BASE + "routing:\n  classifier: {name: ngram}\n", "p"))
    assert isinstance(router.classifier, Ngram)
    assert router.classifier.model.table and DEFAULT_WEIGHTS.exists()
    with pytest.raises(PolicyError) as info:
        parse_policy(
            BASE + f"routing:\n  classifier: {{name: ngram, weights_file: {tmp_path / 'no'}}}\n", "p"
        )
    assert "weights_file" in str(info.value)


def test_a_long_prompt_is_read_at_both_ends_only() -> None:
    head, tail = "integral " * 70, " sonnet" * 90
    text = head + "filler " * 10_000 + tail
    assert len(_features(text).text) <= 1201
    assert words(_features(text).text)[0] == "integral" and words(_features(text).text)[-1] == "sonnet"


def test_a_long_message_is_read_as_its_first_and_last_80_words() -> None:
    every = [chr(97 + i // 26) + chr(97 + i % 26) for i in range(500)]  # aa, ab, ...: no digits
    assert words(" ".join(every)) == every[:80] + every[-80:] and MAX_WORDS == 160
    assert words(" ".join(every[:160])) == every[:160]


def _rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(120):
        hard = i % 3 == 0
        word = "integral" if hard else "capital"
        rows.append(
            {
                "id": f"q{i}",
                "domain": f"d{i % 5}",
                "prompt": f"Question {i}: compute the {word} of item {i % 7}.",
                "weak": 0 if hard else 1,
                "strong": 1,
            }
        )
    return rows


def test_fit_learns_a_word_that_needs_the_strong_model() -> None:
    rows = _rows()
    features = [_features(str(r["prompt"])) for r in rows]
    model = fit(features, [target(r) for r in rows], FitOptions(steps=200))
    clf = Ngram(model)
    assert model.table[key_hash("integral")] > 0 > model.table[key_hash("capital")]
    assert clf.strong_probability(_features("the integral")) > clf.strong_probability(
        _features("the capital")
    )
    scores = cross_validated_scores(rows, features, 3, FitOptions(steps=200))
    hard = [s for s, r in zip(scores, rows, strict=True) if r["weak"] == 0]
    easy = [s for s, r in zip(scores, rows, strict=True) if r["weak"] == 1]
    assert min(hard) > max(easy)


LEVELS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def test_the_options_term_reorders_questions_without_moving_the_calibrated_threshold() -> None:
    # A word per level of difficulty (strong needed from "hotel" up), so the words alone
    # spread the scores; 40 questions (half with alike options) and 60 requests without any.
    texts, rows = [], []
    for i in range(100):
        level = LEVELS[i % 10]
        if i < 40:
            opts = ("red car", "red cab", "red cap", "blue") if i % 2 else ("oak", "sky", "fish", "iron")
            texts.append(MCQ.format(a=opts[0], b=opts[1], c=opts[2], d=opts[3]).replace("gas", level))
        else:
            texts.append(f"Which {level} do plants take in? Tell me about it in a few words please.")
        rows.append({"weak": 0 if i % 10 >= 7 else 1, "strong": 1})
    features = [_features(t) for t in texts]
    targets = [target(r) for r in rows]
    options = FitOptions(steps=50, strong_share=0.3)
    model = fit(features, targets, options)
    without = fit(features, targets, replace(options, options_weight=0.0))
    assert without.options_weight == 0.0 and model.options_weight == options.options_weight
    assert 0.0 < model.options_center < 1.0

    def at_threshold(m: NgramModel) -> tuple[float, int]:
        scores = [Ngram(m).strong_probability(f) for f in features]
        cut = threshold_for_share(scores, 0.3)
        return cut, sum(s >= cut for s in scores[:40])

    # The same threshold sends 30 % strong, and as many questions reach it, in another order.
    (cut, questions), (cut_without, questions_without) = at_threshold(model), at_threshold(without)
    assert cut == pytest.approx(cut_without, abs=0.02) and abs(questions - questions_without) <= 1
    # no prompt lists options: no term
    assert fit(features[40:], targets[40:], options).options_weight == 0.0


def test_targets_and_folds() -> None:
    assert target({"weak": 0, "strong": 1}) == 1.0
    assert target({"weak": 1, "strong": 1}) == 0.5
    assert target({"weak": 1, "strong": 0}) == 0.0
    assert target({"label": "strong"}) == 1.0 and target({"label": "fast"}) == 0.0
    # A subject is held out whole; questions without one are spread by id.
    assert fold_of({"domain": "law", "id": "1"}, 5) == fold_of({"domain": "law", "id": "2"}, 5)
    assert len({fold_of({"id": f"q{i}"}, 5) for i in range(50)}) == 5


def test_auto_uses_the_shipped_ngram_classifier_on_the_embedded_and_default_policies() -> None:
    from gateway.config import EMBEDDED_POLICY, load_policy

    root = Path(__file__).resolve().parents[3]
    for source in (EMBEDDED_POLICY, root / "policies" / "default.yaml"):
        policy = load_policy(str(source))
        assert policy.routing.classifier is not None and policy.routing.classifier.name == "ngram"
        router = Router(policy)
        route = router.resolve({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
        assert route.reason == "score" and route.score is not None
