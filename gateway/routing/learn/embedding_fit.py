"""Building the ``embedding`` classifier's index, and its held-out scores (numpy, imported here).

The index is every labelled prompt's embedding (centred on their mean, unit length), its
target (:func:`gateway.routing.learn.ngram_fit.target`) and a short reference. The constants the
classifier needs to put the neighbours' vote on a common scale are measured on the index
itself: the mean and spread of the neighbours' mean gain with each prompt left out of its
own vote (on up to ``stat_sample`` prompts), of the log length, and of the ngram logit.

Held-out scores use the folds of :func:`gateway.routing.learn.ngram_fit.fold_of` (whole domains
out): each fold's neighbours come from the other folds only, and with ``combine: ngram``
the ngram classifier is refitted without the fold too, so no number is in-sample.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.routing.classifiers.embedding import Combine, Embedding, EmbeddingIndex
from gateway.routing.features import Features
from gateway.routing.learn.ngram_fit import FitOptions, fold_of, progress, target

if TYPE_CHECKING:
    import numpy as np

    from gateway.routing.classifiers.ngram import Ngram
    from gateway.routing.static_embedder import StaticEmbedder

REF_WORDS = 8


@dataclass(frozen=True, slots=True)
class IndexOptions:
    """Knobs of the index (the defaults were chosen on the held-out folds of the training
    file; see docs/routing-quality.md)."""

    neighbours: int = 200
    combine: Combine = "ngram"
    knn_weight: float | None = None
    """The neighbours' weight: default 0.3 with ``combine: ngram`` (more trades GSM8K for
    MMLU), 1 with ``combine: length``."""
    length_weight: float = 0.5
    stat_sample: int = 2000

    def weight(self) -> float:
        """The neighbours' weight, its default resolved."""
        if self.knn_weight is not None:
            return self.knn_weight
        return 0.3 if self.combine == "ngram" else 1.0


def ref_of(row: dict[str, Any], text: str) -> str:
    """A row's reference in ``route explain``: its ``id`` (if any) and first words."""
    words = text.split()
    head = " ".join(words[:REF_WORDS]) + (" ..." if len(words) > REF_WORDS else "")
    return f"{row['id']}: {head}" if row.get("id") is not None else head


def _unit(x: np.ndarray) -> np.ndarray:
    import numpy as np

    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def knn_means(
    queries: np.ndarray, vectors: np.ndarray, gains: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> np.ndarray:
    """For each query row, the mean gain of its ``k`` most similar rows of ``vectors``;
    ``exclude[i]`` (a row of ``vectors``) is left out of query i's vote."""
    import numpy as np

    out = np.empty(len(queries))
    for start in range(0, len(queries), 512):
        sims = queries[start : start + 512] @ vectors.T
        if exclude is not None:
            sims[np.arange(len(sims)), exclude[start : start + 512]] = -np.inf
        near = np.argpartition(sims, -k, axis=1)[:, -k:]
        out[start : start + 512] = gains[near].mean(axis=1)
    return out


def _ngram_logits(ngram: Ngram, features: Sequence[Features]) -> np.ndarray:
    import numpy as np

    return np.asarray([ngram.logit(f) for f in features])


def fit_index(
    rows: Sequence[dict[str, Any]],
    features: Sequence[Features],
    embedder: StaticEmbedder,
    options: IndexOptions = IndexOptions(),
    ngram: Ngram | None = None,
) -> EmbeddingIndex:
    """The index of these labelled prompts."""
    import numpy as np

    if len(rows) < 2:
        raise ValueError("an index needs at least two prompts")
    progress(f"embedding {len(features)} prompts")
    raw = embedder.embed_many([f.text for f in features])
    mean = raw.mean(axis=0)
    vectors = _unit(raw - mean).astype(np.float32)
    gains = np.asarray([target(row) for row in rows], dtype=np.float32)
    k = min(options.neighbours, len(rows) - 1)
    sample = np.asarray(
        sorted(range(len(rows)), key=lambda i: zlib.crc32(str(i).encode()))[: options.stat_sample]
    )
    loo = knn_means(vectors[sample], vectors, gains, k, exclude=sample)
    lengths = np.log1p([f.last_user_chars for f in features])
    about: dict[str, Any] = {
        "embedder": "wordllama l2_supercat 256-d, mean pooled",
        "examples": len(rows),
        "neighbours": options.neighbours,
        "combine": options.combine,
        "knn_weight": options.weight(),
        "knn_mean": round(float(loo.mean()), 6),
        "knn_std": round(float(loo.std()) or 1.0, 6),
        "length_mean": round(float(lengths.mean()), 6),
        # floored: prompts of one template would otherwise make a few characters look huge
        "length_std": round(max(float(lengths.std()), 0.25), 6),
        "length_weight": options.length_weight,
        "ngram_scale": 1.0,
    }
    if options.combine == "ngram":
        if ngram is None:
            from gateway.routing.classifiers.ngram import Ngram, NgramSettings

            ngram = Ngram(NgramSettings())
        about["ngram_scale"] = round(float(_ngram_logits(ngram, features).std()) or 1.0, 6)
    refs = [ref_of(row, f.text) for row, f in zip(rows, features, strict=True)]
    return EmbeddingIndex(vectors, gains, refs, mean.astype(np.float32), about)


def cross_validated_scores(
    rows: Sequence[dict[str, Any]],
    features: Sequence[Features],
    folds: int,
    embedder: StaticEmbedder,
    options: IndexOptions = IndexOptions(),
) -> list[float]:
    """Out-of-fold strong probabilities, with the classifier's formula: each fold's
    neighbours (and, with ``combine: ngram``, its ngram weights) fitted without it. The
    z-scores use the out-of-fold scores' own mean and spread."""
    import numpy as np

    from gateway.routing.learn.ngram_fit import cross_validated_scores as ngram_scores

    progress(f"embedding {len(features)} prompts")
    raw = embedder.embed_many([f.text for f in features])
    gains = np.asarray([target(row) for row in rows], dtype=np.float32)
    fold = np.asarray([fold_of(row, folds) for row in rows])
    knn = np.zeros(len(rows))
    for k in range(folds):
        train, test = np.where(fold != k)[0], np.where(fold == k)[0]
        if len(train) == 0 or len(test) == 0:
            continue
        mean = raw[train].mean(axis=0)
        count = min(options.neighbours, len(train))
        knn[test] = knn_means(_unit(raw[test] - mean), _unit(raw[train] - mean), gains[train], count)
    knn_z = (knn - knn.mean()) / (knn.std() or 1.0)
    if options.combine == "ngram":
        p = np.clip(np.asarray(ngram_scores(rows, features, folds, FitOptions())), 1e-12, 1 - 1e-12)
        logit = np.log(p) - np.log1p(-p)
        z = logit + options.weight() * (logit.std() or 1.0) * knn_z
    else:
        lengths = np.log1p([f.last_user_chars for f in features])
        length_z = (lengths - lengths.mean()) / (lengths.std() or 1.0)
        z = options.weight() * knn_z + options.length_weight * length_z
    return [1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, float(v))))) for v in z]


def options_of(classifier: Embedding) -> IndexOptions:
    """The options a built classifier scores with (for ``route eval --folds``)."""
    about = classifier.index.about
    return IndexOptions(
        neighbours=classifier.neighbours,
        combine=classifier.combine,
        knn_weight=classifier.knn_weight,
        length_weight=float(about["length_weight"]),
    )
