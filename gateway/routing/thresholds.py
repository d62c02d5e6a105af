"""Calibration's one formula: the classifier threshold that sends a given share to ``strong``.

Used on the request path (drift's suggested threshold) and by the learning loop
(:mod:`gateway.routing.learn`), so it lives here, where the request path may import it.
"""

from __future__ import annotations


def threshold_for_share(scores: list[float], share: float) -> float:
    """The threshold that sends ``share`` of these scores to the strong tier (RouteLLM's
    calibration: the (1 - share) quantile)."""
    ordered = sorted(scores)
    if share <= 0:
        return 1.0
    k = max(0, min(len(ordered) - 1, round(len(ordered) * (1 - share))))
    return ordered[k]
