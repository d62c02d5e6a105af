"""The drift monitor on a fake clock: the window, the verdict, the rate-limited warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from gateway.config import PolicyHolder
from gateway.dispatch.clock import ManualClock
from gateway.routing.drift import DriftMonitor

POLICY = """
deployments:
  a: {base_url: "http://127.0.0.1:9/v1"}
  b: {base_url: "http://127.0.0.1:9/v1"}
tiers: {fast: [a], strong: [b]}
routing:
  classifier: {name: linear, bias: 0.0, weights: {}}
  threshold: 0.5
  calibration: {strong_share: 0.3, tolerance: 0.1, window_s: 60, min_decisions: 10, warn_every_s: 600}
"""


@pytest.fixture()
def holder(tmp_path: Path) -> PolicyHolder:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    return PolicyHolder(str(path))


def feed(monitor: DriftMonitor, clock: ManualClock, strong: int, fast: int, step_s: float = 0.1) -> None:
    for i in range(strong + fast):
        monitor.observe(0.8 if i < strong else 0.2, i < strong, 0.5)
        clock.advance(step_s)


def test_no_verdict_below_min_decisions(holder: PolicyHolder) -> None:
    clock = ManualClock()
    monitor = DriftMonitor(holder, clock)
    feed(monitor, clock, strong=0, fast=9)
    verdict = monitor.verdict()
    assert verdict["decisions"] == 9 and verdict["strong_share"] == 0.0
    assert not verdict["enough_decisions"] and not verdict["drifted"]


def test_a_share_within_tolerance_is_not_drift_and_one_beyond_is(holder: PolicyHolder) -> None:
    clock = ManualClock()
    monitor = DriftMonitor(holder, clock)
    feed(monitor, clock, strong=4, fast=16)  # 20 %: 0.1 from 0.3, not beyond it
    assert monitor.verdict()["strong_share"] == 0.2 and not monitor.verdict()["drifted"]
    feed(monitor, clock, strong=0, fast=20)  # 10 %
    verdict = monitor.verdict()
    assert verdict["strong_share"] == 0.1 and verdict["drifted"]
    # route calibrate's rule on the window's scores: the 70 % quantile (every fast one scored 0.2).
    assert verdict["threshold_for_target"] == 0.2


def test_the_window_forgets_old_decisions(holder: PolicyHolder) -> None:
    clock = ManualClock()
    monitor = DriftMonitor(holder, clock)
    feed(monitor, clock, strong=0, fast=30)
    assert monitor.verdict()["drifted"]
    clock.advance(61)
    feed(monitor, clock, strong=3, fast=7)
    verdict = monitor.verdict()
    assert verdict["decisions"] == 10 and verdict["strong_share"] == 0.3 and not verdict["drifted"]


def test_a_new_threshold_starts_a_new_window(holder: PolicyHolder) -> None:
    clock = ManualClock()
    monitor = DriftMonitor(holder, clock)
    feed(monitor, clock, strong=0, fast=30)
    monitor.observe(0.9, True, 0.4)
    report = monitor.report()
    assert report["decisions"] == 1 and report["threshold"] == 0.4


def test_drift_is_logged_once_per_warn_interval(holder: PolicyHolder) -> None:
    clock = ManualClock()
    monitor = DriftMonitor(holder, clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            feed(monitor, clock, strong=0, fast=20, step_s=1.0)
        assert monitor.warnings == 1  # at the 10th decision, the first verdict
        clock.advance(600)
        feed(monitor, clock, strong=0, fast=12, step_s=1.0)
    assert monitor.warnings == 2
    lines = [line for line in logs if line["event"] == "routing_drift"]
    assert len(lines) == 2
    assert (
        lines[0]["target"] == 0.3 and lines[0]["strong_share"] == 0.0 and lines[0]["log_level"] == "warning"
    )


def test_no_target_reports_the_share_without_a_verdict(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.replace("strong_share: 0.3, ", ""))
    clock = ManualClock()
    monitor = DriftMonitor(PolicyHolder(str(path)), clock)
    feed(monitor, clock, strong=1, fast=19)
    report = monitor.report()
    assert report["target"] is None and not report["drifted"] and report["strong_share"] == 0.05
    assert report["threshold_for_target"] is None
    assert sum(b["count"] for b in report["score_histogram"]) == 20
    assert report["score_quantiles"]["p50"] == 0.2
