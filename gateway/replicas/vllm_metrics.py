"""Reading vLLM's ``/metrics``: a forgiving Prometheus text parser and the figures that matter.

vLLM renamed its metrics across versions, so each figure is looked up under every name
it has had, newest first (the first one present wins: 0.9 and 0.10 expose old and new
names side by side with the same values):

- prefix cache queries: ``vllm:prefix_cache_queries_total`` (>= 0.9), before that
  ``vllm:gpu_prefix_cache_queries_total``; hits likewise (``..._hits_total``);
- V0's hit-rate gauge ``vllm:gpu_prefix_cache_hit_rate`` (no counts) when nothing else is there;
- KV cache usage: ``vllm:kv_cache_usage_perc`` (>= 0.9), before that ``vllm:gpu_cache_usage_perc``;
- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` and the TTFT histogram
  ``vllm:time_to_first_token_seconds`` (same names throughout);
- the KV cache block size, the ``block_size`` label of ``vllm:cache_config_info`` (16 on
  GPUs, 128 on the CPU backend): the unit of vLLM's ``cached_tokens``.

Queries and hits count *tokens*. A line that does not parse is skipped, not fatal: one
odd line from a new vLLM must not blind routing to a replica's load.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

_QUERIES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries",
)
_HITS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits",
)
_HIT_RATE_GAUGE = ("vllm:gpu_prefix_cache_hit_rate",)
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_RUNNING = ("vllm:num_requests_running",)
_WAITING = ("vllm:num_requests_waiting",)
_PROMPT_TOKENS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens")
_GENERATION_TOKENS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
_TTFT = "vllm:time_to_first_token_seconds"
CACHE_CONFIG_INFO = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the exposition format: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(text: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from ``text[start]`` (just after ``{``) to the closing ``}``; returns the index after it."""
    labels: dict[str, str] = {}
    i, n = start, len(text)
    while True:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return labels, i + 1
        eq = text.index("=", i)
        key = text[i:eq].strip()
        i = eq + 1
        if text[i] != '"':
            raise ValueError("label value is not quoted")
        i += 1
        out: list[str] = []
        while text[i] != '"':
            ch = text[i]
            if ch == "\\":
                i += 1
                out.append(_ESCAPES.get(text[i], "\\" + text[i]))
            else:
                out.append(ch)
            i += 1
        labels[key] = "".join(out)
        i += 1


def parse_prometheus_text(text: str) -> Iterator[Sample]:
    """Samples of a Prometheus text exposition (format 0.0.4); comments and lines that do not
    parse are skipped."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            brace = line.find("{")
            space = line.find(" ")
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                labels, end = _parse_labels(line, brace + 1)
                rest = line[end:].split()
            else:
                name, *rest = line.split()
                labels = {}
            if not name or not rest:
                continue
            value = float(rest[0])  # float() reads NaN, +Inf and -Inf as Prometheus writes them
        except (ValueError, IndexError):
            continue
        yield Sample(name, labels, value)


@dataclass(slots=True)
class VllmFigures:
    """What one scrape of one vLLM server says (``None``: the server did not report it).

    Counters are cumulative since the server started; :func:`interval` turns two scrapes
    into rates. ``names`` says which metric name each figure was read from.
    """

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    prefix_cache_hit_rate: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    ttft_buckets: list[tuple[float, float]] = field(default_factory=list)
    block_size: int | None = None
    names: dict[str, str] = field(default_factory=dict)

    @property
    def queue(self) -> float:
        """Requests running plus waiting (0 when not reported)."""
        return (self.running or 0.0) + (self.waiting or 0.0)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures (cumulative hit rate included when counters are there)."""
        hit_rate = self.prefix_cache_hit_rate
        if self.prefix_cache_queries_tokens:
            hit_rate = (self.prefix_cache_hits_tokens or 0.0) / self.prefix_cache_queries_tokens
        mean_ttft = (
            self.ttft_sum_s / self.ttft_count if self.ttft_count and self.ttft_sum_s is not None else None
        )
        return {
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "prefix_cache_queries_tokens": self.prefix_cache_queries_tokens,
            "prefix_cache_hits_tokens": self.prefix_cache_hits_tokens,
            "prefix_cache_hit_rate": hit_rate,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "ttft_count": self.ttft_count,
            "ttft_mean_s": mean_ttft,
            "block_size": self.block_size,
            "metric_names": dict(self.names),
        }


def _matches(sample: Sample, model_name: str | None) -> bool:
    return model_name is None or sample.labels.get("model_name", model_name) == model_name


def figures_from_samples(samples: Iterable[Sample], model_name: str | None = None) -> VllmFigures:
    """Sum the samples into :class:`VllmFigures` (over engines and label sets; KV usage takes the
    fullest engine). ``model_name`` keeps only that model's samples."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.name.startswith("vllm:") and _matches(sample, model_name):
            by_name.setdefault(sample.name, []).append(sample)
    figures = VllmFigures()

    def pick(figure: str, names: tuple[str, ...], combine: str = "sum") -> float | None:
        for name in names:
            found = by_name.get(name)
            if found:
                values = [s.value for s in found if not math.isnan(s.value)]
                if not values:
                    continue
                figures.names[figure] = name
                return max(values) if combine == "max" else math.fsum(values)
        return None

    figures.running = pick("running", _RUNNING)
    figures.waiting = pick("waiting", _WAITING)
    figures.kv_cache_usage = pick("kv_cache_usage", _KV_USAGE, "max")
    figures.prefix_cache_queries_tokens = pick("prefix_cache_queries", _QUERIES)
    figures.prefix_cache_hits_tokens = pick("prefix_cache_hits", _HITS)
    figures.prefix_cache_hit_rate = pick("prefix_cache_hit_rate", _HIT_RATE_GAUGE, "max")
    figures.prompt_tokens = pick("prompt_tokens", _PROMPT_TOKENS)
    figures.generation_tokens = pick("generation_tokens", _GENERATION_TOKENS)
    figures.ttft_sum_s = pick("ttft_sum", (_TTFT + "_sum",))
    figures.ttft_count = pick("ttft_count", (_TTFT + "_count",))
    buckets: dict[float, float] = {}
    for sample in by_name.get(_TTFT + "_bucket", []):
        try:
            bound = float(sample.labels["le"])
        except (KeyError, ValueError):
            continue
        buckets[bound] = buckets.get(bound, 0.0) + sample.value
    figures.ttft_buckets = sorted(buckets.items())
    for sample in by_name.get(CACHE_CONFIG_INFO, []):
        raw = sample.labels.get("block_size", "")
        if raw.isdigit() and int(raw) > 0:
            figures.block_size = int(raw)
            break
    return figures


def figures_from_text(text: str, model_name: str | None = None) -> VllmFigures:
    """:func:`figures_from_samples` of a ``/metrics`` body."""
    return figures_from_samples(parse_prometheus_text(text), model_name)


@dataclass(frozen=True, slots=True)
class IntervalFigures:
    """Rates between two scrapes: vLLM's own prefix-cache hit rate (hit tokens / queried
    tokens) and TTFT (mean, and quantiles from the histogram buckets) of that interval."""

    queries_tokens: float
    hits_tokens: float
    requests: float
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None

    @property
    def hit_rate(self) -> float | None:
        """Hit tokens / queried tokens, or ``None`` when nothing was queried."""
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else None


def _delta(before: float | None, after: float | None) -> float:
    if after is None:
        return 0.0
    if before is None or after < before:  # the server restarted: its counters began again
        return after
    return after - before


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``(le, count)`` buckets."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def interval(before: VllmFigures | None, after: VllmFigures) -> IntervalFigures:
    """What happened between two scrapes of one server (``before`` None: since it started)."""
    b = before or VllmFigures()
    count = _delta(b.ttft_count, after.ttft_count)
    total = _delta(b.ttft_sum_s, after.ttft_sum_s)
    earlier = dict(b.ttft_buckets)
    restarted = after.ttft_count is not None and b.ttft_count is not None and after.ttft_count < b.ttft_count
    buckets = [(le, c if restarted else c - earlier.get(le, 0.0)) for le, c in after.ttft_buckets]
    return IntervalFigures(
        queries_tokens=_delta(b.prefix_cache_queries_tokens, after.prefix_cache_queries_tokens),
        hits_tokens=_delta(b.prefix_cache_hits_tokens, after.prefix_cache_hits_tokens),
        requests=count,
        ttft_mean_s=total / count if count else None,
        ttft_p50_s=histogram_quantile(0.5, buckets) if count else None,
        ttft_p95_s=histogram_quantile(0.95, buckets) if count else None,
    )
