"""``switchyard route eval``: how much quality the policy's router buys per strong call.

With per-model quality in the file (``weak``, ``strong``) it prints APGR, CPT(50%) and
CPT(80%) next to random routing's (0.5, 50 %, 80 %), overall and per ``bench``, the
curve at score quantiles as a table (and a PNG with ``--plot``), and where the policy's
threshold lands on it. With only labels it prints the plain agreement, the strong share
and the cost, and the same quantile sweep of agreement. Scores are the classifier's
alone: rules and hints are not applied to the curve.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gateway.policy import Policy
from gateway.routing.features import extract
from gateway.routing.learn.datafiles import body_of, has_quality, labels, load_rows, policy_from, require_gain
from gateway.routing.learn.ngram_fit import progress
from gateway.routing.learn.quality import QualityReport, quantile_thresholds, report, table_rows
from gateway.routing.resolve import Router, order_tier


def _pct(value: float | None) -> str:
    return "never" if value is None else f"{value:.1%}"


def print_quality(name: str, found: QualityReport, threshold: float | None = None) -> None:
    """One report: the headline numbers against random routing, then the curve as a table."""
    print(f"\n{name}: {found.examples} prompts, quality weak {found.weak_quality:.3f}, "
          f"strong {found.strong_quality:.3f}")  # fmt: skip
    if found.strong_quality <= found.weak_quality:
        print("  (strong is judged no better than weak on these prompts: APGR and PGR are meaningless here)")
    print(f"  APGR       {found.apgr:.3f}   (random 0.500)")
    print(f"  CPT(50%)   {_pct(found.cpt50):>6}   (random 50.0%)")
    print(f"  CPT(80%)   {_pct(found.cpt80):>6}   (random 80.0%)")
    verdict = "beats random at every share" if found.worst_margin >= 0 else "worse than random somewhere"
    print(f"  worst PGR - share: {found.worst_margin:+.3f} ({verdict})")
    if threshold is not None:
        at = min(
            (p for p in found.curve if p.threshold <= threshold),
            key=lambda p: p.strong_share,
            default=found.curve[-1],
        )
        print(f"  at the policy's threshold {threshold:g}: strong share {at.strong_share:.1%}, "
              f"PGR {at.pgr:.3f}")  # fmt: skip
    print("  threshold  strong share  quality    PGR")
    for p in table_rows(found.curve):
        shown = "     (none)" if p.threshold == float("inf") else f"{p.threshold:11.4f}"
        print(f"  {shown}  {p.strong_share:12.1%}  {p.quality:7.3f}  {p.pgr:5.3f}")


def require_plot(path: str | None) -> None:
    """Refuse ``--plot`` up front, before a long run, when matplotlib is not installed."""
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'switchyard[plot]'") from None


def plot_lines(lines: Sequence[tuple[str, Sequence[float], Sequence[float]]], ylabel: str, path: str) -> None:
    """Named lines over the strong share, as a PNG."""
    import matplotlib  # only this command pays for matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, xs, ys in lines:
        dashed = name.startswith("random")
        ax.plot(xs, ys, label=name, linestyle="--" if dashed else "-", color="grey" if dashed else None)
    ax.set_xlabel("share of requests sent to the strong tier")
    ax.set_ylabel(ylabel)
    ax.set_title("Routing quality")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}", file=sys.stderr)


def plot_quality(curves: Sequence[tuple[str, QualityReport]], path: str) -> None:
    """The PGR curves against random routing's diagonal."""
    lines: list[tuple[str, Sequence[float], Sequence[float]]] = [("random (APGR 0.500)", [0, 1], [0, 1])]
    for name, found in curves:
        xs = [p.strong_share for p in found.curve]
        lines.append((f"{name} (APGR {found.apgr:.3f})", xs, [p.pgr for p in found.curve]))
    plot_lines(lines, "performance gap recovered (PGR)", path)


def quality_by_bench(
    rows: Sequence[dict[str, Any]], scores: Sequence[float], points: int
) -> list[tuple[str, QualityReport]]:
    """A report for all rows, then one per ``bench`` when there is more than one."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(str(row.get("bench", "all")), []).append(i)
    named = [("all", list(range(len(rows))))]
    if len(groups) > 1:
        named += sorted(groups.items())
    out = []
    for name, idx in named:
        weak = [float(rows[i]["weak"]) for i in idx]
        strong = [float(rows[i]["strong"]) for i in idx]
        out.append((name, report([scores[i] for i in idx], weak, strong, points)))
    return out


def _tier_price(policy: Policy, tier: str, tokens_in: int, tokens_out: int) -> float:
    price = policy.deployments[order_tier(policy, tier)[0]].price
    if price is None:
        return 0.0
    return (tokens_in * price.input + tokens_out * price.output) / 1e6


def _agreement(args: argparse.Namespace, policy: Policy, rows: list[dict[str, Any]]) -> None:
    """The label-only report (and its plot: agreement over the strong share)."""
    y = labels(rows, args.labeled)
    router = Router(policy)
    strong = policy.routing.strong_tier
    decisions = [router.decide(body_of(row)) for row in rows]
    chosen = [1 if d.tier == strong else 0 for d in decisions]
    agree = sum(c == t for c, t in zip(chosen, y, strict=True)) / len(y)
    cost_all_strong = cost = 0.0
    for row, d in zip(rows, decisions, strict=True):
        out_tokens = row.get("max_tokens") or args.output_tokens
        cost_all_strong += _tier_price(policy, strong, d.features.prompt_tokens, out_tokens)
        cost += _tier_price(policy, d.tier, d.features.prompt_tokens, out_tokens)
    print(f"examples: {len(rows)} ({sum(y)} labelled strong)")
    print(f"agreement with the labels: {agree:.1%}")
    print(f"strong share: {sum(chosen) / len(chosen):.1%} (labels: {sum(y) / len(y):.1%})")
    relative = f"{cost / cost_all_strong:.1%}" if cost_all_strong else "n/a (no prices in the policy)"
    print(f"cost relative to all-strong: {relative}  (output tokens assumed {args.output_tokens} when unset)")
    print("(agreement rewards sending everything to the cheap tier when most labels are fast;")
    print(" give per-model quality, `weak` and `strong`, to measure quality per strong call)")
    if router.classifier is None:
        if args.plot:
            raise SystemExit("--plot needs a classifier in the policy")
        return
    scores = [router.classifier.strong_probability(d.features) for d in decisions]
    threshold = policy.routing.threshold
    sweep = sorted({*quantile_thresholds(scores, 20), threshold}, reverse=True)
    print("\nthreshold sweep at score quantiles (classifier alone; rules and hints not applied):")
    print("  threshold  strong share  agreement")
    shares, agreements = [], []
    for t in sweep:
        picks = [1 if s >= t else 0 for s in scores]
        ok = sum(p == label for p, label in zip(picks, y, strict=True)) / len(y)
        mark = "  <- policy" if t == threshold else ""
        print(f"  {t:9.4f}  {sum(picks) / len(picks):12.1%}  {ok:9.1%}{mark}")
        shares.append(sum(picks) / len(picks))
        agreements.append(ok)
    if args.plot:
        plot_lines([("agreement", shares, agreements)], "agreement with the labels", args.plot)


def cmd_eval(args: argparse.Namespace) -> int:
    """``route eval``: quality per strong call, or plain agreement for label-only files."""
    require_plot(args.plot)
    policy = policy_from(args.policy)
    rows = load_rows(args.labeled)
    if not has_quality(rows):
        _agreement(args, policy, rows)
        return 0
    require_gain(rows, args.labeled)
    router = Router(policy)
    if router.classifier is None:
        raise SystemExit("the policy has no routing.classifier to evaluate")
    clf = router.classifier
    progress(f"reading the features of {len(rows)} prompts")
    features = [extract(body_of(row)) for row in rows]
    name = policy.routing.classifier.name if policy.routing.classifier else "?"
    if args.folds > 1 and name == "embedding":
        from gateway.routing.classifiers.embedding import Embedding
        from gateway.routing.learn.embedding_fit import cross_validated_scores as embedding_scores
        from gateway.routing.learn.embedding_fit import options_of

        assert isinstance(clf, Embedding)
        options = options_of(clf)
        scores = embedding_scores(rows, features, args.folds, clf.embedder, options)
        print(
            f"classifier: embedding ({options.neighbours} neighbours, combined with {options.combine}), "
            f"re-indexed on {args.folds} held-out folds (by domain, else by id)"
        )
    elif args.folds > 1:
        if name != "ngram":
            raise SystemExit(
                "--folds refits the ngram classifier (or re-indexes an embedding one): the policy has neither"
            )
        from gateway.routing.learn.ngram_fit import FitOptions, cross_validated_scores

        scores = cross_validated_scores(rows, features, args.folds, FitOptions())
        print(f"classifier: ngram refitted on {args.folds} held-out folds (by domain, else by id)")
    else:
        scores = [clf.strong_probability(f) for f in features]
        print(f"classifier: {name}, threshold {policy.routing.threshold:g}")
    found = quality_by_bench(rows, scores, args.points)
    for bench, one in found:
        print_quality(bench, one, None if args.folds > 1 else policy.routing.threshold)
    if args.plot:
        plot_quality(found, args.plot)
    return 0


def register_eval(rsub: argparse._SubParsersAction[argparse.ArgumentParser], policy_help: str) -> None:
    """Add ``route eval`` to the ``route`` subcommands."""
    evaluate = rsub.add_parser(
        "eval", help="APGR and CPT for per-model quality files; agreement for label-only files"
    )
    evaluate.add_argument(
        "labeled",
        help='JSONL of {"messages": [...] | "prompt": "...", "weak": q, "strong": q} or {..., "label": ...}',
    )
    evaluate.add_argument("--policy", help=policy_help)
    evaluate.add_argument("--output-tokens", type=int, default=256, help="assumed answer length for the cost")
    evaluate.add_argument("--points", type=int, default=200, help="score quantiles on the curve")
    evaluate.add_argument("--plot", help="write the quality curve as a PNG")
    evaluate.add_argument(
        "--folds",
        type=int,
        default=0,
        help="ngram, embedding: score each fold with a model refitted without it (by domain, else id)",
    )
    evaluate.set_defaults(func=cmd_eval)
