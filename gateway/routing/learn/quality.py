"""Routing quality as RouteLLM measures it: quality bought per strong call.

Given a score per prompt (the classifier's strong probability) and each model's quality on
it (``weak``, ``strong``: 1/0 for right/wrong, or any score), a threshold sends the prompts
scoring at or above it to the strong model. Its **PGR** (performance gap recovered) is
``(quality - weak) / (strong - weak)``: 0 for all-weak, 1 for all-strong quality. The
**curve** is PGR against the strong share as the threshold sweeps the score's quantiles;
**APGR** is the area under it (trapezoids over the strong share from 0 to 1), and
**CPT(x)** is the smallest strong share whose PGR reaches ``x``. Random routing has
PGR = strong share in expectation, so its APGR is 0.5 and its CPT(x) is x.

Tied scores move together (a threshold cannot split them), so a classifier that says
the same for everything scores as random, not better.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

RANDOM_APGR = 0.5
"""APGR of random routing (PGR grows in step with the strong share)."""


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One threshold: the share it sends to strong, the mean quality then, and its PGR."""

    threshold: float
    strong_share: float
    quality: float
    pgr: float


@dataclass(frozen=True, slots=True)
class QualityReport:
    """What ``route eval`` prints for one set of prompts."""

    examples: int
    weak_quality: float
    strong_quality: float
    apgr: float
    cpt50: float | None
    cpt80: float | None
    worst_margin: float
    """The smallest PGR minus strong share over the curve's inner points: negative where the
    router does worse than random at some share."""
    curve: tuple[CurvePoint, ...]


def quantile_thresholds(scores: Sequence[float], points: int) -> list[float]:
    """Distinct thresholds at ``points`` + 1 evenly spaced quantiles of the scores (min and max
    included), so the curve follows the scores however they bunch."""
    ordered = sorted(scores)
    n = len(ordered)
    picked = {ordered[min(n - 1, round(i * (n - 1) / points))] for i in range(points + 1)}
    return sorted(picked)


def curve(
    scores: Sequence[float],
    weak: Sequence[float],
    strong: Sequence[float],
    points: int = 200,
) -> list[CurvePoint]:
    """The quality curve from all-weak to all-strong, ordered by rising strong share."""
    n = len(scores)
    if n == 0 or not len(weak) == len(strong) == n:
        raise ValueError("scores, weak and strong need the same, non-zero length")
    order = sorted(range(n), key=lambda i: scores[i])
    ascending = [scores[i] for i in order]
    # gain_above[k]: what sending the n - k highest-scored prompts to strong adds to the total.
    gain_above = [0.0] * (n + 1)
    for k in range(n - 1, -1, -1):
        i = order[k]
        gain_above[k] = gain_above[k + 1] + strong[i] - weak[i]
    weak_total = sum(weak)
    gap = sum(strong) - weak_total

    def point(threshold: float, k: int) -> CurvePoint:
        quality = (weak_total + gain_above[k]) / n
        pgr = gain_above[k] / gap if gap else 0.0
        return CurvePoint(threshold, (n - k) / n, quality, pgr)

    thresholds = reversed(quantile_thresholds(scores, points))
    return [point(float("inf"), n), *(point(t, bisect.bisect_left(ascending, t)) for t in thresholds)]


def apgr(points: Sequence[CurvePoint]) -> float:
    """Area under PGR over the strong share (trapezoids)."""
    return sum((b.strong_share - a.strong_share) * (a.pgr + b.pgr) / 2 for a, b in pairwise(points))


def cpt(points: Sequence[CurvePoint], target: float) -> float | None:
    """The smallest strong share at which the PGR reaches ``target`` (linear between points),
    or None when no threshold gets there."""
    for a, b in pairwise(points):
        if a.pgr >= target:
            return a.strong_share
        if b.pgr >= target:
            fraction = (target - a.pgr) / (b.pgr - a.pgr)
            return a.strong_share + fraction * (b.strong_share - a.strong_share)
    return None


def report(
    scores: Sequence[float], weak: Sequence[float], strong: Sequence[float], points: int = 200
) -> QualityReport:
    """APGR, CPT(50%), CPT(80%) and the curve for these prompts."""
    found = curve(scores, weak, strong, points)
    inner = [p.pgr - p.strong_share for p in found if 0.0 < p.strong_share < 1.0]
    n = len(scores)
    return QualityReport(
        examples=n,
        weak_quality=sum(weak) / n,
        strong_quality=sum(strong) / n,
        apgr=apgr(found),
        cpt50=cpt(found, 0.5),
        cpt80=cpt(found, 0.8),
        worst_margin=min(inner, default=0.0),
        curve=tuple(found),
    )


def table_rows(points: Sequence[CurvePoint], rows: int = 11) -> list[CurvePoint]:
    """About ``rows`` points of the curve, evenly spread over the strong share, for a table."""
    picked: list[CurvePoint] = []
    for i in range(rows):
        target = i / (rows - 1)
        best = min(points, key=lambda p: abs(p.strong_share - target))
        if not picked or best is not picked[-1]:
            picked.append(best)
    return picked
