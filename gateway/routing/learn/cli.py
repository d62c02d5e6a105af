"""``switchyard route explain | fit | calibrate | eval | judge``: read, fit and check a routing policy.

``eval`` lives in :mod:`gateway.routing.learn.evaluate`, the ``ngram`` fit in
:mod:`gateway.routing.learn.fit_command`, ``judge`` in :mod:`gateway.routing.learn.judge`; this module
registers them all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import yaml

from gateway.policy import Policy
from gateway.routing.classifiers.linear import Linear, fit
from gateway.routing.features import FEATURE_NAMES, extract
from gateway.routing.learn.datafiles import body_of, has_quality, load_rows, policy_from
from gateway.routing.learn.datafiles import labels as _labels
from gateway.routing.learn.evaluate import register_eval
from gateway.routing.learn.fit_command import cmd_fit_embedding, cmd_fit_ngram, register_fit_options
from gateway.routing.learn.judge import register_judge
from gateway.routing.learn.routellm import register_import
from gateway.routing.resolve import Router
from gateway.routing.thresholds import threshold_for_share
from gateway.store.gate import REDIS_FAULTS


def _matrix(rows: list[dict[str, Any]]) -> list[list[float]]:
    out = []
    for row in rows:
        vector = extract(row).vector()
        out.append([vector[name] for name in FEATURE_NAMES])
    return out


def _gain_label(gain: float) -> str:
    if gain >= 0.75:
        return "strong needed"
    if gain <= 0.25:
        return "weak better"
    return f"either ({gain:.2f})" if gain != 0.5 else "either"


def _cmd_explain(args: argparse.Namespace) -> int:
    policy = policy_from(args.policy)
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
        parts = router.classifier.explain(features)
        print("  share of the logit, most telling first:")
        for label, part in parts[: args.top]:
            print(f"  {label:24} {part:+.3f}")
        if len(parts) > args.top:
            print(f"  ... {len(parts) - args.top} more (--top)")
        near = router.classifier.neighbours_of(features)
        if near:
            mean = sum(n.gain for n in near) / len(near)
            print(
                f"  the {len(near)} nearest labelled prompts voted {mean:.3f}"
                " (1: strong needed, 0: weak better)"
            )
            print("  similarity  label          prompt")
            for n in near[: args.top]:
                print(f"  {n.similarity:10.3f}  {_gain_label(n.gain):13}  {n.ref}")
            if len(near) > args.top:
                print(f"  ... {len(near) - args.top} more (--top)")
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
    rows = load_rows(args.labeled)
    if args.classifier == "ngram":
        return cmd_fit_ngram(args, rows)
    if args.classifier == "embedding":
        return cmd_fit_embedding(args, rows)
    if has_quality(rows) and not any("label" in row for row in rows):
        raise SystemExit("per-model quality rows fit the ngram classifier: add --classifier ngram")
    y = _labels(rows, args.labeled)
    if len(set(y)) < 2:
        raise SystemExit("fit needs examples of both labels")
    spec = fit(_matrix(rows), y, 1.0 if args.l2 is None else args.l2)
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
    return [router.classifier.strong_probability(extract(body_of(row))) for row in rows]


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if not 0 <= args.strong_share <= 1:
        raise SystemExit("--strong-share is a fraction between 0 and 1")
    policy = policy_from(args.policy)
    scores = _scores(policy, load_rows(args.prompts))
    threshold = threshold_for_share(scores, args.strong_share)
    share = sum(s >= threshold for s in scores) / len(scores)
    print(f"# {len(scores)} prompts: threshold {threshold:.4f} sends {share:.1%} to strong", file=sys.stderr)
    # The target goes with the threshold: the drift warning compares the live share with it.
    block = {"threshold": round(threshold, 4), "calibration": {"strong_share": args.strong_share}}
    print(yaml.safe_dump({"routing": block}, sort_keys=False), end="")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("route", help="explain, fit, calibrate, evaluate and judge the routing policy")
    rsub = p.add_subparsers(dest="route_command", required=True)
    policy_help = "policy file (default: $SWITCHYARD_POLICY, else the embedded policy)"

    explain = rsub.add_parser("explain", help="show the features, score, rule and choice for one request")
    explain.add_argument("request", help="a chat completion request body (JSON file)")
    explain.add_argument("--policy", help=policy_help)
    explain.add_argument("--hint", help="as the x-switchyard-tier header")
    explain.add_argument("--top", type=int, default=15, help="the parts of the score shown")
    explain.set_defaults(func=_cmd_explain)

    fit = rsub.add_parser("fit", help="fit a classifier (linear, ngram or embedding) to labeled traffic")
    fit.add_argument(
        "labeled",
        help='JSONL of {"messages": [...] | "prompt": "...", "label": "fast"|"strong"} '
        'or per-model quality {..., "weak": q, "strong": q}',
    )
    fit.add_argument("--classifier", choices=("linear", "ngram", "embedding"), default="linear")
    fit.add_argument(
        "--out",
        help="linear: write the routing block here (default: stdout); ngram: the weights file; "
        "embedding: the index file",
    )
    fit.add_argument("--l2", type=float, default=None, help="L2 regularization strength")
    register_fit_options(fit)
    fit.set_defaults(func=_cmd_fit)

    calibrate = rsub.add_parser("calibrate", help="set the threshold for a share of strong requests")
    calibrate.add_argument("prompts", help='JSONL of {"messages": [...]}')
    calibrate.add_argument("--strong-share", type=float, required=True)
    calibrate.add_argument("--policy", help=policy_help)
    calibrate.set_defaults(func=_cmd_calibrate)

    register_eval(rsub, policy_help)
    register_judge(rsub, policy_help)
    register_import(rsub)
    for command in rsub.choices.values():
        command.set_defaults(func=_one_line_errors(command.get_default("func")))


def _one_line_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A missing file or an unreachable Redis ends a ``route`` command with one line, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except OSError as exc:
            if exc.filename is None:
                raise
            raise SystemExit(
                f"switchyard route {args.route_command}: {exc.filename}: {exc.strerror}"
            ) from None
        except REDIS_FAULTS as exc:
            raise SystemExit(
                f"switchyard route {args.route_command}: cannot reach Redis ({type(exc).__name__}: {exc}); "
                "check REDIS_URL / --redis-url"
            ) from None

    return run
