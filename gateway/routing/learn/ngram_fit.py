"""Fitting the ``ngram`` classifier (numpy, imported only here), and cross-validation that
holds whole domains out, so a reported number is for subjects the model never saw.

The target is the strong call's gain (:func:`target`). The fit is L2-regularized logistic
regression by full-batch Adam over a sparse design: a column per n-gram hash seen in at
least ``min_df`` training prompts, valued count / sqrt(n-grams in the prompt) as the
classifier computes it, and a column per chosen shape feature; the length and answer-option
terms ride on top, each with a fixed weight.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gateway.routing.classifiers.ngram import NgramModel, key_hash, keys, words
from gateway.routing.features import Features, options_similarity
from gateway.routing.thresholds import threshold_for_share

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Knobs of the fit (the defaults are the ones the shipped weights were fitted with)."""

    l2: float = 1.0
    """L2 strength on the n-gram weights (relative to the mean log loss, times the examples)."""
    shape_l2: float = 0.01
    """L2 strength on the shape features: a dozen dense columns need little."""
    min_df: int = 2
    steps: int = 300
    learning_rate: float = 0.05
    shape_features: tuple[str, ...] = ()
    """The shape features fitted beside the n-grams. None by default: fitted jointly on a mix
    of benchmarks they learn what tells the benchmarks apart (GSM8K needs strong more often
    and is shorter), which reverses their sign inside each one."""
    length_weight: float = 0.5
    """The fixed logit added per unit of log(1 + characters of the last user message),
    centred on the training mean: longer prompts lean strong inside every benchmark, which
    a joint fit cannot see (chosen on the held-out folds: 0.25-1.0 all do)."""
    options_weight: float = 2.0
    """The fixed logit per unit of answer-option similarity
    (:func:`~gateway.routing.features.options_similarity`): alike options lean strong
    (chosen on the held-out folds: 1.5-4 all do, 2-3 best; text without options is not touched).
    Its centre is fitted (:func:`_options_center`)."""
    strong_share: float = 0.3
    """The share of the training prompts the policy's threshold is meant to send to strong;
    the options term is centred so that it does not move that threshold."""
    keep: int = 40_000
    """The n-gram weights kept, largest first (keeps the shipped file small)."""


def _hashes(features: Features) -> Counter[int]:
    return Counter(key_hash(key) for key in keys(words(features.text)))


def _design(
    docs: Sequence[Counter[int]], shape: Sequence[Sequence[float]], columns: dict[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for r, doc in enumerate(docs):
        scale = 1.0 / max(1, sum(doc.values())) ** 0.5
        for h, count in doc.items():
            c = columns.get(h)
            if c is not None:
                rows.append(r)
                cols.append(c)
                vals.append(count * scale)
    return np.asarray(rows), np.asarray(cols), np.asarray(vals), np.asarray(shape, dtype=float)


def fit(
    features: Sequence[Features], targets: Sequence[float], options: FitOptions = FitOptions()
) -> NgramModel:
    """Fit on these prompts' features; ``targets`` in [0, 1] (see :func:`target`)."""
    import numpy as np

    docs = [_hashes(f) for f in features]
    df = Counter(h for doc in docs for h in doc)
    vocabulary = sorted(h for h, n in df.items() if n >= options.min_df)
    columns = {h: i for i, h in enumerate(vocabulary)}
    shape_rows = [[f.vector()[name] for name in options.shape_features] for f in features]
    rows, cols, vals, dense = _design(docs, shape_rows, columns)
    dense = dense.reshape(len(features), len(options.shape_features))
    n, sparse_width = len(features), len(vocabulary)
    y = np.asarray(targets, dtype=float)
    w = np.zeros(sparse_width)
    v = np.zeros(dense.shape[1])
    bias = float(np.log(max(y.mean(), 1e-3) / max(1 - y.mean(), 1e-3)))
    params = [w, v, np.array([bias])]
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    for step in range(1, options.steps + 1):
        z = np.bincount(rows, weights=vals * w[cols], minlength=n) + dense @ v + params[2][0]
        g = (1.0 / (1.0 + np.exp(-np.clip(z, -60, 60))) - y) / n
        grads = [
            np.bincount(cols, weights=vals * g[rows], minlength=sparse_width) + options.l2 * w / n,
            dense.T @ g + options.shape_l2 * v / n,
            np.array([g.sum()]),
        ]
        for p, grad, (m, s) in zip(params, grads, moments, strict=True):
            m *= 0.9
            m += 0.1 * grad
            s *= 0.999
            s += 0.001 * grad * grad
            p -= options.learning_rate * (m / (1 - 0.9**step)) / (np.sqrt(s / (1 - 0.999**step)) + 1e-8)
    top = np.argsort(-np.abs(w))[: options.keep]
    table = {int(vocabulary[i]): float(w[i]) for i in top if w[i] != 0.0}
    shape = {name: float(x) for name, x in zip(options.shape_features, v, strict=True) if abs(x) > 1e-6}
    lengths = [math.log1p(f.last_user_chars) for f in features]
    model = NgramModel(
        bias=float(params[2][0]),
        shape=shape,
        table=table,
        about={"examples": n, "ngrams": len(table)},
        length_weight=options.length_weight,
        length_center=round(sum(lengths) / max(1, n), 4),
    )
    listed = {i: x for i, f in enumerate(features) if (x := options_similarity(f.text)) is not None}
    if not listed or not options.options_weight:
        return model
    center = _options_center(model, features, listed, options)
    return replace(model, options_weight=options.options_weight, options_center=center)


def _options_center(
    model: NgramModel, features: Sequence[Features], listed: dict[int, float], options: FitOptions
) -> float:
    """The similarity at which the options term is 0: the one at which as many of the
    prompts that list options reach the threshold that sends ``strong_share`` of all the
    prompts to strong as without the term. The term then reorders those prompts without
    moving the calibrated threshold (centred on their mean instead, it spread their scores
    and raised the threshold, which then sent less of everything else to strong)."""
    import numpy as np

    from gateway.routing.classifiers.ngram import Ngram

    clf = Ngram(model)
    logits = [clf.logit(f) for f in features]
    # The logistic function keeps the order, so the threshold's logit is the same quantile.
    cut = threshold_for_share(logits, options.strong_share)
    z = np.asarray(logits)[list(listed)]
    similarity = np.fromiter(listed.values(), dtype=float)
    wanted = float(np.mean(z >= cut))
    low, high = 0.0, 1.0
    for _ in range(30):  # the share falls as the centre rises
        mid = (low + high) / 2
        if np.mean(z + options.options_weight * (similarity - mid) >= cut) > wanted:
            low = mid
        else:
            high = mid
    return round((low + high) / 2, 4)


def target(row: dict[str, Any]) -> float:
    """A row's target: for per-model quality ``(strong - weak + 1) / 2`` (1 where only the
    strong model is right, 0.5 where both or neither are, 0 where only the weak one is), so
    the score orders prompts by the expected gain of the strong call; for a label, 1 for
    ``strong`` and 0 for ``fast``."""
    if "weak" in row and "strong" in row:
        gain = float(row["strong"]) - float(row["weak"])
        return min(1.0, max(0.0, (gain + 1.0) / 2.0))
    return 1.0 if row.get("label") == "strong" else 0.0


def fold_of(row: dict[str, Any], folds: int) -> int:
    """The row's held-out fold: by its ``domain`` when it has one (every prompt of a subject
    held out together), else by its ``id`` (each question alone); stable across runs."""
    group = row.get("domain") or row.get("id") or row.get("prompt") or ""
    return zlib.crc32(str(group).encode()) % folds


def progress(message: str) -> None:
    """One line on stderr while a long fit or evaluation runs (stdout keeps the results)."""
    print(f"  .. {message}", file=sys.stderr, flush=True)


def cross_validated_scores(
    rows: Sequence[dict[str, Any]],
    features: Sequence[Features],
    folds: int,
    options: FitOptions = FitOptions(),
) -> list[float]:
    """Out-of-fold strong probabilities: each row scored by a model fitted without its fold."""
    from gateway.routing.classifiers.ngram import Ngram

    fold = [fold_of(row, folds) for row in rows]
    targets = [target(row) for row in rows]
    scores = [0.0] * len(rows)
    for k in range(folds):
        progress(f"fitting fold {k + 1} of {folds} ({len(rows)} rows)")
        train = [i for i in range(len(rows)) if fold[i] != k]
        model = fit([features[i] for i in train], [targets[i] for i in train], options)
        clf = Ngram(model)
        for i in range(len(rows)):
            if fold[i] == k:
                scores[i] = clf.strong_probability(features[i])
    return scores
