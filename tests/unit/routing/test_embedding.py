"""The ``embedding`` classifier: the index, its neighbours, its scores, and what it costs to
have it (nothing unless a policy uses it). Tests that embed need the optional extra
(``pip install 'switchyard[embeddings]'``, which .ci/run installs) and are skipped cleanly
without it; the lazy-load and missing-extra tests run everywhere."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.config import PolicyError, parse_policy
from gateway.routing.features import extract

HAS_EXTRA = importlib.util.find_spec("wordllama") is not None
needs_extra = pytest.mark.skipif(not HAS_EXTRA, reason="needs pip install 'switchyard[embeddings]'")
BASE = """
deployments:
  f: {base_url: "http://x/v1"}
  s: {base_url: "http://x/v1"}
tiers: {fast: [f], strong: [s]}
"""
TOPICS = ("series", "integral", "sequence", "polynomial", "matrix", "limit", "group", "function")
NAMES = ("Ann", "Bob", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana")


def _rows() -> list[dict[str, Any]]:
    """Hard maths questions (only the strong model right) and small talk (both right)."""
    rows = []
    for i, (topic, name) in enumerate(zip(TOPICS, NAMES, strict=True)):
        rows.append(
            {
                "id": f"proof-{i}",
                "prompt": f"Prove that the {topic} converges, then derive its closed form step by step.",
                "weak": 0,
                "strong": 1,
            }
        )
        rows.append(
            {
                "id": f"chat-{i}",
                "prompt": f"Say hello to {name} for me and wish them a lovely weekend with the family.",
                "weak": 1,
                "strong": 1,
            }
        )
    return rows


def _features(text: str):  # type: ignore[no-untyped-def]
    return extract({"messages": [{"role": "user", "content": text}]})


def _index(rows: list[dict[str, Any]], **options: Any):  # type: ignore[no-untyped-def]
    from gateway.routing.learn.embedding_fit import IndexOptions, fit_index
    from gateway.routing.static_embedder import load

    features = [_features(row["prompt"]) for row in rows]
    return fit_index(rows, features, load(), IndexOptions(**options))


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@needs_extra
def test_word_by_word_tokens_are_the_whole_texts() -> None:
    from gateway.routing.static_embedder import load

    embedder = load()
    text = "Prove that the integral of x^2 over [0, 1] is 1/3.\nThen explain why."
    whole = embedder.tokenizer.encode(text, add_special_tokens=False).ids
    assert embedder.token_ids(text) == whole
    assert embedder.token_ids(text) == whole  # from the memo
    vector = embedder.embed(text)
    assert vector.shape == (256,) and abs(float((vector * vector).sum()) - 1.0) < 1e-5


@needs_extra
def test_neighbours_of_a_prompt_are_the_similar_labelled_prompts() -> None:
    from gateway.routing.classifiers.embedding import Embedding

    clf = Embedding(_index(_rows(), neighbours=4, combine="length"))
    near = clf.neighbours_of(_features("Prove that the product converges and derive a closed form."))
    assert len(near) == 4 and all(n.ref.startswith("proof-") for n in near)
    assert near[0].similarity >= near[-1].similarity and all(n.gain == 1.0 for n in near)
    chat = clf.neighbours_of(_features("Please say hello to Iris and wish her a lovely weekend."))
    assert all(n.ref.startswith("chat-") for n in chat)
    assert "Prove that the" in near[0].ref  # the id and the first words


@needs_extra
def test_score_moves_with_the_labels() -> None:
    from gateway.routing.classifiers.embedding import Embedding

    rows = _rows()
    question = _features("Prove that the product converges and derive a closed form.")
    as_labelled = Embedding(_index(rows, neighbours=4, combine="length"))
    flipped_rows = [{**row, "weak": row["strong"], "strong": row["weak"]} for row in rows]
    flipped = Embedding(_index(flipped_rows, neighbours=4, combine="length"))
    assert as_labelled.strong_probability(question) > flipped.strong_probability(question)
    parts = dict(as_labelled.explain(question))
    assert parts["neighbours"] > 0 > dict(flipped.explain(question))["neighbours"]
    assert set(parts) == {"neighbours", "length"}
    # combined with ngram: the neighbours shift the ngram logit, by knn_weight x its spread
    blended = Embedding(_index(rows, neighbours=4))
    parts = dict(blended.explain(question))
    assert set(parts) == {"neighbours", "ngram"} and parts["neighbours"] > 0
    assert blended.knn_weight == 0.3


@needs_extra
def test_a_long_prompt_is_read_as_its_head_and_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.routing.classifiers.embedding import Embedding
    from gateway.routing.static_embedder import StaticEmbedder

    clf = Embedding(_index(_rows(), neighbours=4, combine="length"))
    seen: list[str] = []
    embed = StaticEmbedder.embed
    monkeypatch.setattr(StaticEmbedder, "embed", lambda self, text: seen.append(text) or embed(self, text))
    long_prompt = "Say hello. " + "filler words " * 500 + "Prove that the series converges."
    features = _features(long_prompt)
    clf.strong_probability(features)
    assert seen == [features.text] and seen[0].startswith("Say hello.") and seen[0].endswith("converges.")
    assert len(seen[0]) == 1201


@needs_extra
def test_index_file_round_trips(tmp_path: Path) -> None:
    from gateway.routing.classifiers.embedding import EmbeddingIndex

    index = _index(_rows(), neighbours=3)
    index.dump(tmp_path / "i.npz")
    again = EmbeddingIndex.load(tmp_path / "i.npz")
    assert again.refs == index.refs and again.about == index.about
    assert abs(again.vectors - index.vectors).max() < 1e-3  # stored as float16
    (tmp_path / "bad.npz").write_bytes(b"not an index")
    with pytest.raises(PolicyError) as info:
        parse_policy(
            BASE + f"routing:\n  classifier: {{name: embedding, index_file: '{tmp_path / 'bad.npz'}'}}\n", "p"
        )
    assert "cannot read the index" in str(info.value)


@needs_extra
def test_route_fit_then_explain_shows_the_neighbours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _write(tmp_path / "q.jsonl", _rows())
    index = tmp_path / "index.npz"
    assert (
        main(
            ["route", "fit", str(data), "--classifier", "embedding", "--out", str(index), "--neighbours", "4"]
        )
        == 0
    )
    out = capsys.readouterr().out
    block = yaml.safe_load(out.split("merge into your policy:\n")[1])
    assert block["routing"]["classifier"] == {"name": "embedding", "index_file": str(index)}
    assert "held-out quality" in out  # per-model quality: the held-out report first
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(BASE + yaml.safe_dump(block))
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "Prove the limit converges."}]}))
    assert main(["route", "explain", "--policy", str(policy_file), str(request), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "classifier: embedding" in out and "nearest labelled prompts voted" in out
    shown = out.split("similarity  label")[1].split("\n")[1:4]
    assert all("strong needed" in line and "proof-" in line for line in shown)
    assert "... 1 more (--top)" in out
    assert main(["route", "eval", str(data), "--policy", str(policy_file), "--folds", "2"]) == 0
    out = capsys.readouterr().out
    assert "re-indexed on 2 held-out folds" in out and "APGR" in out


def test_the_missing_extra_is_one_clear_line_at_policy_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def without_wordllama(name: str, package: str | None = None) -> Any:
        return None if name == "wordllama" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_wordllama)
    with pytest.raises(PolicyError) as info:
        parse_policy(BASE + "routing:\n  classifier: {name: embedding, index_file: i.npz}\n", "p")
    assert "pip install 'switchyard[embeddings]'" in str(info.value)
    data = _write(tmp_path / "q.jsonl", _rows())
    with pytest.raises(SystemExit) as exit_info:
        main(["route", "fit", str(data), "--classifier", "embedding", "--out", str(tmp_path / "i.npz")])
    assert "pip install 'switchyard[embeddings]'" in str(exit_info.value)


def test_an_embedding_policy_names_its_index() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(BASE + "routing:\n  classifier: {name: embedding}\n", "p")
    assert "index_file" in str(info.value)


def test_the_gateway_never_loads_the_model_unless_a_policy_uses_it() -> None:
    code = (
        "import sys\n"
        "import gateway.http.app\n"
        "from gateway.config import EMBEDDED_POLICY, load_policy\n"
        "from gateway.routing.resolve import Router\n"
        "router = Router(load_policy(str(EMBEDDED_POLICY)))\n"
        "assert type(router.classifier).__name__ == 'Ngram'\n"
        "heavy = ('numpy', 'tokenizers', 'wordllama', 'gateway.routing.static_embedder')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
