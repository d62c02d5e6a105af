"""``switchyard route explain | fit | calibrate | eval``: read, fit and check a routing policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from gateway.config import EMBEDDED_POLICY, PolicyError, load_policy
from gateway.policy import Policy
from gateway.routing.classifiers.linear import Linear, fit
from gateway.routing.features import FEATURE_NAMES, Features, extract
from gateway.routing.resolve import Router, order_tier


def _policy(path: str | None) -> Policy:
    source = path or os.environ.get("SWITCHYARD_POLICY") or str(EMBEDDED_POLICY)
    try:
        return load_policy(source)
    except PolicyError as exc:
        raise SystemExit(f"{exc}") from None


def _lines(path: str) -> list[dict[str, Any]]:
    out = []
    for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            raise SystemExit(f"{path}:{number}: expected an object with 'messages'")
        out.append(obj)
    return out


def _labels(rows: list[dict[str, Any]], path: str) -> list[int]:
    labels = []
    for number, row in enumerate(rows, start=1):
        label = row.get("label")
        if label not in ("fast", "strong"):
            raise SystemExit(f"{path}: row {number}: label must be 'fast' or 'strong', not {label!r}")
        labels.append(1 if label == "strong" else 0)
    return labels


def _matrix(rows: list[dict[str, Any]]) -> list[list[float]]:
    out = []
    for row in rows:
        vector = extract(row).vector()
        out.append([vector[name] for name in FEATURE_NAMES])
    return out


def _cmd_explain(args: argparse.Namespace) -> int:
    policy = _policy(args.policy)
    body = orjson.loads(Path(args.request).read_bytes())
    if not isinstance(body, dict):
        raise SystemExit(f"{args.request}: a request body is a JSON object")
    body.setdefault("model", "auto")
    router = Router(policy)
    features = extract(body, args.hint)
    print("features:")
    vector = features.vector()
    for name, value in features.as_dict().items():
        scaled = f"  (normalized {vector[name]:.3f})" if name in vector else ""
        print(f"  {name:16} {value!s:>10}{scaled}")
    if router.classifier is not None and policy.routing.classifier is not None:
        print(f"classifier: {policy.routing.classifier.name}")
        for label, part in router.classifier.explain(features):
            print(f"  {label:16} {part:+.3f}")
    route = router.resolve(body, args.hint)
    decision = router.decide(body, args.hint) if route.tier is not None and route.reason != "model" else None
    if decision is not None:
        if decision.score is not None:
            print(f"score: {decision.score:.3f} (threshold {policy.routing.threshold:g})")
        if decision.rule is not None:
            print(f"rule: {decision.rule}")
    print(f"tier: {route.tier or '-'}  ({route.header()})")
    print(f"deployments, in order: {', '.join(route.deployments)}")
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    rows = _lines(args.labeled)
    y = _labels(rows, args.labeled)
    if len(set(y)) < 2:
        raise SystemExit("fit needs examples of both labels")
    spec = fit(_matrix(rows), y, args.l2)
    clf = Linear(spec)
    hits = sum(
        (clf.strong_probability(extract(r)) >= 0.5) == bool(label) for r, label in zip(rows, y, strict=True)
    )
    block = {"routing": {"classifier": spec.model_dump(), "threshold": 0.5}}
    text = yaml.safe_dump(block, sort_keys=False)
    print(
        f"# fitted on {len(rows)} examples ({sum(y)} strong): training agreement {hits / len(rows):.1%}",
        file=sys.stderr,
    )
    if args.out:
        Path(args.out).write_text(text)
        print(f"# written to {args.out}: merge it into your policy's routing section", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _scores(policy: Policy, rows: list[dict[str, Any]]) -> list[float]:
    router = Router(policy)
    if router.classifier is None:
        raise SystemExit("the policy has no routing.classifier to calibrate (see `switchyard route fit`)")
    return [router.classifier.strong_probability(extract(row)) for row in rows]


def threshold_for_share(scores: list[float], share: float) -> float:
    """The threshold that sends ``share`` of these scores to the strong tier (RouteLLM's
    calibration: the (1 - share) quantile)."""
    ordered = sorted(scores)
    if share <= 0:
        return 1.0
    k = max(0, min(len(ordered) - 1, round(len(ordered) * (1 - share))))
    return ordered[k]


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if not 0 <= args.strong_share <= 1:
        raise SystemExit("--strong-share is a fraction between 0 and 1")
    policy = _policy(args.policy)
    scores = _scores(policy, _lines(args.prompts))
    threshold = threshold_for_share(scores, args.strong_share)
    share = sum(s >= threshold for s in scores) / len(scores)
    print(f"# {len(scores)} prompts: threshold {threshold:.4f} sends {share:.1%} to strong", file=sys.stderr)
    print(yaml.safe_dump({"routing": {"threshold": round(threshold, 4)}}, sort_keys=False), end="")
    return 0


def _tier_price(policy: Policy, tier: str, tokens_in: int, tokens_out: int) -> float:
    price = policy.deployments[order_tier(policy, tier)[0]].price
    if price is None:
        return 0.0
    return (tokens_in * price.input + tokens_out * price.output) / 1e6


def _cmd_eval(args: argparse.Namespace) -> int:
    policy = _policy(args.policy)
    rows = _lines(args.labeled)
    y = _labels(rows, args.labeled)
    router = Router(policy)
    routing = policy.routing
    strong = routing.strong_tier
    decisions = [router.decide({**row, "model": "auto"}) for row in rows]
    feats: list[Features] = [d.features for d in decisions]
    chosen = [1 if d.tier == strong else 0 for d in decisions]
    agree = sum(c == t for c, t in zip(chosen, y, strict=True)) / len(y)
    cost_all_strong = cost = 0.0
    for row, f, d in zip(rows, feats, decisions, strict=True):
        out_tokens = row.get("max_tokens") or args.output_tokens
        cost_all_strong += _tier_price(policy, strong, f.prompt_tokens, out_tokens)
        cost += _tier_price(policy, d.tier, f.prompt_tokens, out_tokens)
    print(f"examples: {len(rows)} ({sum(y)} labelled strong)")
    print(f"agreement with the labels: {agree:.1%}")
    print(f"strong share: {sum(chosen) / len(chosen):.1%} (labels: {sum(y) / len(y):.1%})")
    relative = f"{cost / cost_all_strong:.1%}" if cost_all_strong else "n/a (no prices in the policy)"
    print(f"cost relative to all-strong: {relative}  (output tokens assumed {args.output_tokens} when unset)")
    sweep: list[tuple[float, float, float]] = []
    if router.classifier is not None:
        scores = [router.classifier.strong_probability(f) for f in feats]
        print("\nthreshold sweep (classifier alone; rules and hints not applied):")
        print("  threshold  strong share  agreement")
        for i in range(1, 20):
            t = i / 20
            picks = [1 if s >= t else 0 for s in scores]
            share = sum(picks) / len(picks)
            ok = sum(p == label for p, label in zip(picks, y, strict=True)) / len(y)
            sweep.append((t, share, ok))
            mark = "  <- policy" if abs(t - routing.threshold) < 1e-9 else ""
            print(f"  {t:9.2f}  {share:12.1%}  {ok:9.1%}{mark}")
    if args.plot:
        _plot(sweep, args.plot)
    return 0


def _plot(sweep: list[tuple[float, float, float]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    if not sweep:
        raise SystemExit("--plot needs a classifier in the policy")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s for _, s, _ in sweep], [a for _, _, a in sweep], marker="o")
    for t, s, a in sweep[::3]:
        ax.annotate(f"{t:.2f}", (s, a), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("share of requests sent to the strong tier")
    ax.set_ylabel("agreement with the labels")
    ax.set_title("Routing threshold sweep")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("route", help="explain, fit, calibrate and evaluate the routing policy")
    rsub = p.add_subparsers(dest="route_command", required=True)
    policy_help = "policy file (default: $SWITCHYARD_POLICY, else the embedded policy)"

    explain = rsub.add_parser("explain", help="show the features, score, rule and choice for one request")
    explain.add_argument("request", help="a chat completion request body (JSON file)")
    explain.add_argument("--policy", help=policy_help)
    explain.add_argument("--hint", help="as the x-switchyard-tier header")
    explain.set_defaults(func=_cmd_explain)

    fit = rsub.add_parser("fit", help="fit the linear classifier to labeled traffic")
    fit.add_argument("labeled", help='JSONL of {"messages": [...], "label": "fast"|"strong"}')
    fit.add_argument("--out", help="write the routing block here (default: stdout)")
    fit.add_argument("--l2", type=float, default=1.0, help="L2 regularization strength")
    fit.set_defaults(func=_cmd_fit)

    calibrate = rsub.add_parser("calibrate", help="set the threshold for a share of strong requests")
    calibrate.add_argument("prompts", help='JSONL of {"messages": [...]}')
    calibrate.add_argument("--strong-share", type=float, required=True)
    calibrate.add_argument("--policy", help=policy_help)
    calibrate.set_defaults(func=_cmd_calibrate)

    evaluate = rsub.add_parser("eval", help="agreement, strong share, cost and a threshold sweep")
    evaluate.add_argument("labeled")
    evaluate.add_argument("--policy", help=policy_help)
    evaluate.add_argument("--output-tokens", type=int, default=256, help="assumed answer length for the cost")
    evaluate.add_argument("--plot", help="write the sweep as a PNG")
    evaluate.set_defaults(func=_cmd_eval)
