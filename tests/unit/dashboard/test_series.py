"""The dashboard's series: minutes folded into points, percentiles per point."""

from __future__ import annotations

from gateway.dashboard.histogram import bucket_of
from gateway.dashboard.series import MAX_POINTS, SeriesBuilder, minutes_per_point


def test_points_cover_at_most_max_points() -> None:
    assert minutes_per_point(5) == 1
    assert minutes_per_point(120) == 1
    assert minutes_per_point(121) == 2
    assert minutes_per_point(1440) == 1440 // MAX_POINTS


def test_a_point_sums_its_minutes_and_merges_their_histograms() -> None:
    minutes = range(1000, 1240)  # 4 h: two minutes a point
    series = SeriesBuilder(minutes, 60)
    assert series.point_of(1000) == series.point_of(1001) == 0 and series.point_of(1239) == 119
    for minute, ms in ((1000, 10.0), (1001, 100.0)):
        point = series.point_of(minute)
        series.add(point, "a", "requests", 1)
        series.add(point, "a", "tier:fast", 1)
        series.add(point, "a", f"h:e2e:{bucket_of(ms)}", 1)
    series.add(0, "a", "errors", 1)
    series.add(0, "a", "cost_nusd", 2_000)
    series.add_cache(0, {"prompt_tokens": 100, "cached_tokens": 50, "expected_cached_tokens": 80})
    out = series.result()
    assert out["step_s"] == 120 and out["t"][:2] == [60_000, 60_120] and len(out["t"]) == 120
    assert out["requests"][0] == 2 and sum(out["requests"]) == 2
    assert out["error_rate"][0] == 0.5 and out["error_rate"][1] is None
    assert out["cost_usd"][0] == 0.000002
    assert out["tiers"] == {"fast": [2] + [0] * 119}
    e2e = out["deployments"]["a"]["e2e_ms"]
    assert 9.5 < e2e["p50"][0] < 10.5 and 95 < e2e["p95"][0] < 105  # the two minutes' requests together
    assert e2e["p50"][1] is None and out["deployments"]["a"]["ttft_ms"]["p95"][0] is None
    assert out["cache"]["hit_rate"][:2] == [0.5, None] and out["cache"]["expected_hit_rate"][0] == 0.8
