"""APGR, CPT and the curve on cases small enough to compute by hand."""

from __future__ import annotations

import random

import pytest

from gateway.routing.learn.quality import apgr, cpt, curve, quantile_thresholds, report
from gateway.routing.thresholds import threshold_for_share

# Four prompts: the weak model gets the last two right, the strong one all four, so the
# quality gap is 2 of 4 and the first two prompts are the ones that need the strong model.
WEAK = [0.0, 0.0, 1.0, 1.0]
STRONG = [1.0, 1.0, 1.0, 1.0]


def test_perfect_router() -> None:
    # Shares 0, 1/4, 1/2, 3/4, 1 give PGR 0, 1/2, 1, 1, 1: area 1/16 + 3/16 + 1/4 + 1/4.
    found = report([0.9, 0.8, 0.2, 0.1], WEAK, STRONG)
    assert [p.strong_share for p in found.curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [p.pgr for p in found.curve] == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert found.apgr == pytest.approx(0.75)
    assert found.cpt50 == pytest.approx(0.25)
    assert found.cpt80 == pytest.approx(0.4)  # 0.3 of the way from PGR 0.5 to 1.0 between 1/4 and 1/2
    assert found.worst_margin == pytest.approx(0.25)
    assert found.weak_quality == 0.5 and found.strong_quality == 1.0


def test_inverted_router() -> None:
    # PGR 0, 0, 0, 1/2, 1: area 1/16 + 3/16.
    found = report([0.1, 0.2, 0.8, 0.9], WEAK, STRONG)
    assert found.apgr == pytest.approx(0.25)
    assert found.cpt50 == pytest.approx(0.75)
    assert found.worst_margin == pytest.approx(-0.5)


def test_a_constant_score_is_random_routing() -> None:
    # Ties move together: one step from all-weak to all-strong, a straight line.
    found = report([0.5] * 4, WEAK, STRONG)
    assert [p.strong_share for p in found.curve] == [0.0, 1.0]
    assert found.apgr == pytest.approx(0.5)
    assert found.cpt50 == pytest.approx(0.5)
    assert found.cpt80 == pytest.approx(0.8)


def test_random_scores_average_to_half() -> None:
    rng = random.Random(7)
    weak = [float(rng.random() < 0.6) for _ in range(4000)]
    strong = [float(rng.random() < 0.8) for _ in range(4000)]
    assert report([rng.random() for _ in weak], weak, strong).apgr == pytest.approx(0.5, abs=0.03)


def test_scores_not_just_right_or_wrong() -> None:
    # Graded quality: the gap is 0.6 + 0.2 = 0.8; sending the first prompt recovers 3/4 of it.
    points = curve([1.0, 0.0], [0.2, 0.5], [0.8, 0.7])
    assert [p.pgr for p in points] == pytest.approx([0.0, 0.75, 1.0])
    assert apgr(points) == pytest.approx(0.5 * 0.75 / 2 + 0.5 * (0.75 + 1) / 2)
    assert cpt(points, 0.99) is not None and cpt(points, 1.5) is None


def test_thresholds_follow_the_score_quantiles_not_a_grid() -> None:
    # Scores bunched in [0.30, 0.31]: a 0.05 grid would see one step, quantiles see them all.
    scores = [0.30 + i / 10_000 for i in range(100)]
    thresholds = quantile_thresholds(scores, 20)
    assert len(thresholds) == 21 and min(thresholds) == 0.30 and max(thresholds) < 0.31
    assert len(curve(scores, [0.0] * 100, [1.0] * 100, points=20)) == 22


def test_threshold_for_share() -> None:
    scores = [i / 100 for i in range(100)]
    threshold = threshold_for_share(scores, 0.3)
    assert sum(s >= threshold for s in scores) == 30
    assert threshold_for_share(scores, 0.0) == 1.0


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        curve([0.1], [0.0, 1.0], [1.0, 1.0])
