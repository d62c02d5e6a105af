"""``switchyard route fit --classifier ngram|embedding``: held-out numbers first, then the
weights (ngram) or the index (embedding).

With ``--folds K`` (default 5) the rows are split into K folds by ``domain`` (every prompt
of a subject together) or, without one, by ``id`` (each question alone); each fold is
scored by a model fitted on the others, and the quality report (``route eval``'s: APGR,
CPT, per ``bench``) is printed for those out-of-fold scores. Then one model is fitted on
every row and written to ``--out``, with the routing block that uses it and the threshold
that sends ``--strong-share`` of these prompts to the strong tier. The embedding index is
built the same way (:mod:`gateway.routing.learn.embedding_fit`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gateway.routing.classifiers.ngram import DEFAULT_WEIGHTS, Ngram
from gateway.routing.features import extract
from gateway.routing.learn.datafiles import body_of, has_quality, holdout_of, require_gain, write_rows
from gateway.routing.learn.evaluate import plot_quality, print_quality, quality_by_bench, require_plot
from gateway.routing.learn.ngram_fit import FitOptions, cross_validated_scores, fit, progress, target
from gateway.routing.thresholds import threshold_for_share


def register_fit_options(parser: argparse.ArgumentParser) -> None:
    """The ``route fit`` options only the ngram classifier reads."""
    parser.add_argument("--folds", type=int, default=5, help="ngram: held-out folds to report (0: none)")
    parser.add_argument(
        "--strong-share", type=float, default=0.3, help="ngram: the share the printed threshold sends strong"
    )
    parser.add_argument("--plot", help="ngram: write the held-out quality curve as a PNG")
    parser.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        help="ngram, embedding: share of the rows (by id) kept out of the fit, for `route eval` to "
        "compare old and new policies on (needs --holdout-out)",
    )
    parser.add_argument("--holdout-out", help="where --holdout writes the held-out rows (JSONL)")
    parser.add_argument("--neighbours", type=int, default=200, help="embedding: prompts that vote")
    parser.add_argument(
        "--combine",
        choices=("ngram", "length"),
        default="ngram",
        help="embedding: add the neighbours' vote to the ngram logit, or to the length term alone",
    )
    parser.add_argument(
        "--knn-weight", type=float, default=None, help="embedding: the neighbours' weight (0.3 / 1)"
    )


def fit_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a fit may use: checked, and without the ``--holdout`` share, which is written to
    ``--holdout-out`` so old and new policies are compared on prompts the new one never saw."""
    if not rows:
        raise SystemExit("fit needs examples")
    if not has_quality(rows) and any(row.get("label") not in ("fast", "strong") for row in rows):
        raise SystemExit("every row needs per-model quality (`weak`, `strong`) or a label (fast|strong)")
    if has_quality(rows):
        require_gain(rows, args.labeled)
    if not args.holdout:
        return rows
    if not args.holdout_out:
        raise SystemExit("--holdout needs --holdout-out FILE: where the held-out rows go")
    held = [row for row in rows if holdout_of(row, args.holdout)]
    kept = [row for row in rows if not holdout_of(row, args.holdout)]
    if not held or not kept:
        raise SystemExit(f"--holdout {args.holdout} leaves {len(kept)} rows to fit and {len(held)} held out")
    write_rows(held, args.holdout_out)
    print(f"# {len(held)} rows held out in {args.holdout_out} (fitted on the other {len(kept)})")
    return kept


def _held_out(args: argparse.Namespace, rows: list[dict[str, Any]], scores: list[float]) -> None:
    print(f"held-out quality ({args.folds} folds by domain, else by id; numbers for unseen subjects):")
    found = quality_by_bench(rows, scores, 200)
    for bench, one in found:
        print_quality(bench, one)
    if args.plot:
        plot_quality(found, args.plot)


def _print_block(block: dict[str, Any], threshold: float, share: float) -> None:
    block["threshold"] = round(threshold, 4)
    print(f"# the threshold sends {share:.0%} of these prompts to strong; merge into your policy:")
    sys.stdout.write(yaml.safe_dump({"routing": block}, sort_keys=False))


def cmd_fit_ngram(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    """Report held-out quality, fit on everything, write the weights."""
    require_plot(args.plot)
    rows = fit_rows(args, rows)
    options = FitOptions(strong_share=args.strong_share)
    if args.l2 is not None:
        options = replace(options, l2=args.l2)
    progress(f"reading the features of {len(rows)} prompts")
    features = [extract(body_of(row)) for row in rows]
    if args.folds > 1 and has_quality(rows):
        _held_out(args, rows, cross_validated_scores(rows, features, args.folds, options))
    progress(f"fitting on all {len(rows)} prompts")
    model = fit(features, [target(row) for row in rows], options)
    out = Path(args.out) if args.out else Path("ngram_weights.json")
    model.dump(out)
    clf = Ngram(model)
    threshold = threshold_for_share([clf.strong_probability(f) for f in features], args.strong_share)
    shipped = out.resolve() == DEFAULT_WEIGHTS.resolve()
    block: dict[str, Any] = {"classifier": {"name": "ngram"}}
    if not shipped:
        block["classifier"]["weights_file"] = str(out)
    print(f"\n# fitted on {len(rows)} prompts: {len(model.table)} n-gram weights written to {out}")
    _print_block(block, threshold, args.strong_share)
    return 0


def cmd_fit_embedding(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    """Report held-out quality, index every row, write the index."""
    from gateway.routing.classifiers.embedding import Embedding
    from gateway.routing.learn.embedding_fit import IndexOptions, cross_validated_scores, fit_index
    from gateway.routing.static_embedder import EmbeddingUnavailable, load

    require_plot(args.plot)
    rows = fit_rows(args, rows)
    if args.neighbours < 1:
        raise SystemExit("--neighbours is at least 1")
    try:
        embedder = load()
    except EmbeddingUnavailable as exc:
        raise SystemExit(str(exc)) from None
    options = IndexOptions(neighbours=args.neighbours, combine=args.combine, knn_weight=args.knn_weight)
    features = [extract(body_of(row)) for row in rows]
    if args.folds > 1 and has_quality(rows):
        _held_out(args, rows, cross_validated_scores(rows, features, args.folds, embedder, options))
    try:
        index = fit_index(rows, features, embedder, options)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    out = Path(args.out) if args.out else Path("embedding_index.npz")
    index.dump(out)
    clf = Embedding(index, embedder)
    threshold = threshold_for_share([clf.strong_probability(f) for f in features], args.strong_share)
    print(
        f"\n# indexed {len(rows)} prompts ({options.neighbours} neighbours vote, combined with "
        f"{options.combine}) in {out}"
    )
    _print_block({"classifier": {"name": "embedding", "index_file": str(out)}}, threshold, args.strong_share)
    return 0
