"""Calibration drift: the live strong share of the classifier's decisions against the share
the threshold was calibrated for (``routing.calibration.strong_share``, which
``route calibrate`` writes).

A threshold calibrated on one kind of traffic sends another share to strong on another
(issue #15 measured 22-36 % for a 30 % calibration). :class:`DriftMonitor` is a sink of
finished requests: it keeps the classifier's recent decisions (score and tier) over
``window_s`` (at most :data:`MAX_DECISIONS` of them) and, when at least ``min_decisions``
are in the window and the strong share is further than ``tolerance`` from the target,
logs one ``routing_drift`` warning (at most every ``warn_every_s``). :meth:`report` is
what ``GET /admin/routing/drift`` answers: the share, the target, the verdict, the score
distribution and the threshold that would have hit the target on the window's scores.

Only decisions made by the classifier's score count: hints and rules are not calibrated.
The window is this process's (with ``--workers N`` each worker keeps its own, a sample of
the same traffic); the Prometheus counters are the whole gateway's. A policy reload that
changes the threshold starts a new window: decisions made at another threshold do not
describe this one.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from gateway.config import PolicyHolder
from gateway.dispatch.clock import SYSTEM_CLOCK, Clock
from gateway.routing.thresholds import threshold_for_share

if TYPE_CHECKING:
    from gateway.telemetry.record import FinishedRequest

_log = structlog.get_logger("switchyard.routing")

MAX_DECISIONS = 20_000
"""The most decisions a window holds (the oldest go first)."""
SCORE_BINS = 20
"""The score histogram of the report: 20 bins of 0.05."""


class DriftMonitor:
    """The live strong share of the classifier's decisions, and the drift warning."""

    def __init__(self, holder: PolicyHolder, clock: Clock = SYSTEM_CLOCK) -> None:
        self._holder = holder
        self._clock = clock
        self._decisions: deque[tuple[float, float, bool]] = deque()
        self._strong = 0
        self._threshold: float | None = None
        self._last_warning = -math.inf
        self.warnings = 0
        """Drift warnings logged since start."""

    def record(self, done: FinishedRequest) -> None:
        """Count a finished request's routing decision when the classifier made it."""
        route = done.route
        if route is None or route.score is None:
            return
        routing = self._holder.current.policy.routing
        self.observe(route.score, route.tier == routing.strong_tier, route.threshold)

    def observe(self, score: float, strong: bool, threshold: float | None = None) -> None:
        """Add one classifier decision (a new ``threshold`` starts a new window)."""
        if threshold != self._threshold:
            self._decisions.clear()
            self._strong = 0
            self._threshold = threshold
        now = self._clock.now()
        if len(self._decisions) >= MAX_DECISIONS:
            self._strong -= self._decisions.popleft()[2]
        self._decisions.append((now, score, strong))
        self._strong += strong
        self._check(now)

    def _expire(self, now: float, window_s: float) -> None:
        decisions = self._decisions
        while decisions and decisions[0][0] < now - window_s:
            self._strong -= decisions.popleft()[2]

    def _check(self, now: float) -> None:
        # Cheap on every decision (the expiry is amortized O(1)); the sort for the suggested
        # threshold runs only for a warning, at most once per warn_every_s.
        calibration = self._holder.current.policy.routing.calibration
        target = calibration.strong_share
        if target is None or now - self._last_warning < calibration.warn_every_s:
            return
        self._expire(now, calibration.window_s)
        n = len(self._decisions)
        if n < calibration.min_decisions or abs(self._strong / n - target) <= calibration.tolerance:
            return
        verdict = self.verdict(suggest=False)
        self._last_warning = now
        self.warnings += 1
        _log.warning(
            "routing_drift",
            strong_share=verdict["strong_share"],
            target=verdict["target"],
            tolerance=verdict["tolerance"],
            decisions=verdict["decisions"],
            window_s=verdict["window_s"],
            threshold=self._threshold,
            threshold_for_target=self._threshold_for(verdict["target"]),
            hint="run `switchyard route calibrate` on recent prompts, or see GET /admin/routing/drift",
        )

    def verdict(self, suggest: bool = True) -> dict[str, Any]:
        """The share over the window now and whether it drifted from the target; with
        ``suggest``, the threshold that would have hit the target on the window's scores."""
        calibration = self._holder.current.policy.routing.calibration
        now = self._clock.now()
        self._expire(now, calibration.window_s)
        n = len(self._decisions)
        share = self._strong / n if n else None
        target = calibration.strong_share
        enough = n >= calibration.min_decisions
        off_by = abs(share - target) if target is not None and share is not None else 0.0
        drifted = enough and off_by > calibration.tolerance
        return {
            "decisions": n,
            "strong": self._strong,
            "strong_share": None if share is None else round(share, 4),
            "target": target,
            "tolerance": calibration.tolerance,
            "window_s": calibration.window_s,
            "min_decisions": calibration.min_decisions,
            "enough_decisions": enough,
            "drifted": drifted,
            "threshold_for_target": self._threshold_for(target) if suggest else None,
        }

    def _threshold_for(self, share: float | None) -> float | None:
        """The threshold that would have sent ``share`` of the window's decisions to strong
        (``route calibrate``'s rule), None without a target or decisions."""
        if share is None or not self._decisions:
            return None
        return round(threshold_for_share([d[1] for d in self._decisions], share), 4)

    def summary(self) -> dict[str, Any]:
        """The dashboard's line: decisions, live share, target and a one-word verdict
        (``drifted``, ``ok``, ``too few decisions`` or ``no target``)."""
        verdict = self.verdict(suggest=False)
        if verdict["target"] is None:
            word = "no target"
        elif not verdict["enough_decisions"]:
            word = "too few decisions"
        else:
            word = "drifted" if verdict["drifted"] else "ok"
        return {
            "decisions": verdict["decisions"],
            "strong_share": verdict["strong_share"],
            "target": verdict["target"],
            "verdict": word,
        }

    def report(self) -> dict[str, Any]:
        """The verdict, the threshold in force and the window's score distribution (JSON-ready)."""
        body = self.verdict()
        bins = [0] * SCORE_BINS
        scores = sorted(d[1] for d in self._decisions)
        for score in scores:
            bins[min(SCORE_BINS - 1, max(0, int(score * SCORE_BINS)))] += 1
        quantiles: dict[str, float | None] = {}
        for q in (0.1, 0.25, 0.5, 0.75, 0.9):
            quantiles[f"p{round(q * 100)}"] = round(scores[int(q * (len(scores) - 1))], 4) if scores else None
        body["threshold"] = self._threshold
        body["score_quantiles"] = quantiles
        body["score_histogram"] = [
            {"from": round(i / SCORE_BINS, 2), "to": round((i + 1) / SCORE_BINS, 2), "count": c}
            for i, c in enumerate(bins)
        ]
        body["warnings"] = self.warnings
        return body
