"""Reading vLLM's /metrics across metric-name versions, defensively."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.replicas.vllm_metrics import (
    VllmFigures,
    figures_from_text,
    histogram_quantile,
    interval,
    parse_prometheus_text,
)
from local_backend.sim import ModelMetrics, render_metrics

# vLLM 0.5/0.6 (V0 engine): gpu_* names, a hit-rate gauge, no hit/query counters.
V0_TEXT = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 3.0
vllm:num_requests_waiting{model_name="llama"} 1.0
vllm:gpu_cache_usage_perc{model_name="llama"} 0.25
vllm:gpu_prefix_cache_hit_rate{model_name="llama"} 0.4
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="llama"} 1.0
"""

# vLLM 0.9/0.10 (V1): the new names next to the deprecated ones, same values.
V09_TEXT = """\
vllm:num_requests_running{engine="0",model_name="llama"} 2.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="llama"} 600.0
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 600.0
"""

# vLLM >= 0.11: only the new names; two engines (internal data parallel) to be summed.
V011_TEXT = """\
vllm:num_requests_running{engine="0",model_name="llama"} 2.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.7
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="llama"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 50.0
vllm:prefix_cache_hits_total{engine="1",model_name="llama"} 150.0
"""


def test_v0_names_give_usage_queue_and_the_hit_rate_gauge() -> None:
    figures = figures_from_text(V0_TEXT)
    assert (figures.running, figures.waiting, figures.kv_cache_usage) == (3.0, 1.0, 0.25)
    assert figures.prefix_cache_queries_tokens is None
    assert figures.to_dict()["prefix_cache_hit_rate"] == 0.4
    assert figures.names["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert figures.ttft_count == 4.0 and figures.to_dict()["ttft_mean_s"] == 0.25


def test_when_old_and_new_names_coexist_the_new_one_is_read_once() -> None:
    figures = figures_from_text(V09_TEXT)
    assert figures.prefix_cache_queries_tokens == 1000.0  # not 2000: the copies are not summed
    assert figures.prefix_cache_hits_tokens == 600.0
    assert figures.names["prefix_cache_queries"] == "vllm:prefix_cache_queries_total"
    assert figures.names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert figures.to_dict()["prefix_cache_hit_rate"] == pytest.approx(0.6)


def test_old_counter_names_alone_are_read() -> None:
    text = "\n".join(line for line in V09_TEXT.splitlines() if "gpu_" in line or "requests" in line)
    figures = figures_from_text(text)
    assert figures.prefix_cache_hits_tokens == 600.0
    assert figures.names["prefix_cache_hits"] == "vllm:gpu_prefix_cache_hits_total"
    assert figures.kv_cache_usage == 0.5


def test_engines_are_summed_and_kv_usage_is_the_fullest_engine() -> None:
    figures = figures_from_text(V011_TEXT)
    assert figures.running == 7.0 and figures.waiting == 1.0 and figures.queue == 8.0
    assert figures.kv_cache_usage == 0.7
    assert (figures.prefix_cache_queries_tokens, figures.prefix_cache_hits_tokens) == (400.0, 200.0)


def test_model_name_filter_keeps_one_models_samples() -> None:
    text = V011_TEXT + 'vllm:num_requests_running{engine="0",model_name="other"} 40.0\n'
    assert figures_from_text(text, model_name="llama").running == 7.0
    assert figures_from_text(text).running == 47.0


def test_lines_that_do_not_parse_are_skipped_not_fatal() -> None:
    text = (
        "garbage line without value\n"
        'vllm:num_requests_running{model_name="a" 3\n'  # unclosed labels
        'vllm:num_requests_waiting{model_name="a"} not-a-number\n'
        'vllm:kv_cache_usage_perc{model_name="a \\"quoted\\" \\\\ name"} 0.5 1700000000000\n'
        "vllm:num_requests_running 2\n"
        'vllm:prefix_cache_hits_total{model_name="a"} NaN\n'
    )
    figures = figures_from_text(text)
    assert figures.running == 2.0
    assert figures.waiting is None
    assert figures.kv_cache_usage == 0.5
    assert figures.prefix_cache_hits_tokens is None
    samples = list(parse_prometheus_text(text))
    assert samples[0].labels == {"model_name": 'a "quoted" \\ name'}


def test_parser_agrees_with_prometheus_client_on_the_simulators_output() -> None:
    metrics = ModelMetrics()
    metrics.cache_queries, metrics.cache_hits, metrics.prompt_tokens = 1234, 1024, 1234
    metrics.ttft.observe(0.03)
    metrics.ttft.observe(0.3)
    metrics.finished["stop"] = 2
    text = render_metrics([('m "1"', metrics, 2, 1, 0.125), ("m2", ModelMetrics(), 0, 0, 0.0)])
    ours = {(s.name, tuple(sorted(s.labels.items())), s.value) for s in parse_prometheus_text(text)}
    theirs = {
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert ours == theirs
    figures = figures_from_text(text, model_name='m "1"')
    assert figures.prefix_cache_queries_tokens == 1234 and figures.prefix_cache_hits_tokens == 1024
    assert figures.running == 2 and figures.waiting == 1 and figures.kv_cache_usage == 0.125
    assert figures.ttft_count == 2


def test_interval_gives_the_hit_rate_and_ttft_between_two_scrapes() -> None:
    before = VllmFigures(
        prefix_cache_queries_tokens=1000, prefix_cache_hits_tokens=100, ttft_sum_s=1.0, ttft_count=10,
        ttft_buckets=[(0.1, 5.0), (1.0, 10.0), (math.inf, 10.0)],
    )  # fmt: skip
    after = VllmFigures(
        prefix_cache_queries_tokens=3000, prefix_cache_hits_tokens=1700, ttft_sum_s=2.0, ttft_count=20,
        ttft_buckets=[(0.1, 15.0), (1.0, 20.0), (math.inf, 20.0)],
    )  # fmt: skip
    delta = interval(before, after)
    assert delta.hit_rate == pytest.approx(1600 / 2000)
    assert delta.requests == 10 and delta.ttft_mean_s == pytest.approx(0.1)
    assert delta.ttft_p50_s == pytest.approx(0.05)  # all 10 new ones fell in the first bucket


def test_interval_after_a_restart_counts_from_zero() -> None:
    before = VllmFigures(
        prefix_cache_queries_tokens=5000, prefix_cache_hits_tokens=4000, ttft_count=50, ttft_sum_s=5
    )
    after = VllmFigures(
        prefix_cache_queries_tokens=200, prefix_cache_hits_tokens=50, ttft_count=2, ttft_sum_s=1
    )
    delta = interval(before, after)
    assert (delta.queries_tokens, delta.hits_tokens, delta.requests) == (200, 50, 2)
    assert interval(None, VllmFigures()).hit_rate is None


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == 0.1
    assert histogram_quantile(0.5, []) is None


def test_the_block_size_is_read_from_the_cache_config_info() -> None:
    text = (
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        'enable_prefix_caching="True"} 1.0\n'
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
    )
    figures = figures_from_text(text, model_name="tiny")
    assert figures.block_size == 128
    assert figures.to_dict()["block_size"] == 128
    assert figures_from_text('vllm:cache_config_info{block_size="None"} 1.0\n').block_size is None
