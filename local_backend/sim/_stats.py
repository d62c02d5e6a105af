"""Counters behind ``/sim/stats`` and the vLLM-named Prometheus text of ``/metrics``."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

RECENT_REQUESTS = 500

# vLLM V1's bucket bounds (vllm/v1/metrics/loggers.py), so dashboards built for vLLM fit.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class Histogram:
    """A Prometheus histogram (cumulative buckets rendered on scrape)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (``le`` is inclusive, as Prometheus wants)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.count += times
        self.total += value * times


class ModelMetrics:
    """One model's counters and histograms (the ``model_name`` label)."""

    __slots__ = (
        "cache_hits",
        "cache_queries",
        "e2e",
        "finished",
        "generation_tokens",
        "itl",
        "prompt_tokens",
        "queue",
        "ttft",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cache_queries = 0
        self.cache_hits = 0
        self.finished: dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)


class SimStats:
    """What tests read from ``/sim/stats``. ``in_flight`` survives :meth:`reset` (it is
    the truth about open requests); everything else starts over."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        """Zero the counters and forget the recent requests."""
        self.requests_total = 0
        self.completed = 0
        self.cancelled = 0
        self.aborted = 0
        self.by_model: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.queries_tokens = 0
        self.hits_tokens = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)

    def begin(self, endpoint: str, headers: Mapping[str, str]) -> dict[str, Any]:
        """Count a new API request and return its (mutable) entry in ``recent``."""
        self.requests_total += 1
        self.in_flight += 1
        record: dict[str, Any] = {
            "seq": self.requests_total,
            "endpoint": endpoint,
            "model": None,
            "stream": False,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "status": 0,
            "outcome": "in_flight",
            "faults": [],
            "x-request-id": headers.get("x-request-id"),
            "traceparent": headers.get("traceparent"),
            "authorization": "Authorization" in headers,
            "body_keys": [],
            "stream_options": None,
            "prompt_cache_key": None,
            "cache_control": [],
            "started_at": time.time(),
            "duration_ms": None,
        }
        self.recent.append(record)
        return record

    def count_model(self, model: str) -> None:
        self.by_model[model] = self.by_model.get(model, 0) + 1

    def count_faults(self, names: Iterable[str]) -> None:
        for name in names:
            self.faults[name] = self.faults.get(name, 0) + 1

    def finish(self, record: dict[str, Any], outcome: str) -> None:
        """Close a request once: ``cancelled`` (the client left), ``reset_mid_stream`` (we cut
        it: counted as ``aborted``) or anything else (``completed``)."""
        if record["outcome"] != "in_flight":
            return
        record["outcome"] = outcome
        record["duration_ms"] = round((time.time() - record["started_at"]) * 1000.0, 3)
        if outcome == "cancelled":
            self.cancelled += 1
        elif outcome == "reset_mid_stream":
            self.aborted += 1
        else:
            self.completed += 1

    def to_dict(self) -> dict[str, Any]:
        """The ``/sim/stats`` body."""
        return {
            "requests_total": self.requests_total,
            "in_flight": self.in_flight,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "aborted": self.aborted,
            "by_model": self.by_model,
            "faults": self.faults,
            "prefix_cache": {"queries_tokens": self.queries_tokens, "hits_tokens": self.hits_tokens},
            "recent": list(self.recent),
        }


# (model, metrics, running, waiting, kv_cache_usage)
_Row = tuple[str, ModelMetrics, int, int, float]


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(rows: Iterable[_Row]) -> str:
    """Prometheus text (format 0.0.4) for ``(model, metrics, running, waiting, kv_usage)`` rows."""
    rows = list(rows)
    out: list[str] = []
    labels = [f'engine="0",model_name="{_label_value(row[0])}"' for row in rows]

    simple: tuple[tuple[str, str, str, Callable[[_Row], float]], ...] = (
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            lambda r: r[2],
        ),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", lambda r: r[3]),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", lambda r: r[4]),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            lambda r: r[1].cache_queries,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            lambda r: r[1].cache_hits,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            lambda r: r[1].prompt_tokens,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            lambda r: r[1].generation_tokens,
        ),
    )
    for name, kind, help_text, get in simple:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{label}}} {float(get(row))}" for label, row in zip(labels, rows, strict=True))

    out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    out.append("# TYPE vllm:request_success_total counter")
    for label, row in zip(labels, rows, strict=True):
        for reason, count in sorted(row[1].finished.items()):
            out.append(f'vllm:request_success_total{{{label},finished_reason="{reason}"}} {float(count)}')

    histograms = (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    )
    for name, help_text, attr in histograms:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} histogram")
        for label, row in zip(labels, rows, strict=True):
            hist: Histogram = getattr(row[1], attr)
            cumulative = 0
            for bound, count in zip(hist.bounds, hist.counts, strict=False):
                cumulative += count
                out.append(f'{name}_bucket{{{label},le="{bound}"}} {float(cumulative)}')
            out.append(f'{name}_bucket{{{label},le="+Inf"}} {float(hist.count)}')
            out.append(f"{name}_count{{{label}}} {float(hist.count)}")
            out.append(f"{name}_sum{{{label}}} {hist.total}")
    return "\n".join(out) + "\n"
