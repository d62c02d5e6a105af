"""The local GPU backend: launch, supervise and read ``vllm serve``.

- :class:`VllmLaunch`: the validated knobs of one launch (a policy deployment's
  ``launch:`` block, or the file of ``switchyard local serve CONFIG.yaml``), mapped to
  vLLM's real flags by :func:`plan_replicas` (one :class:`ReplicaPlan` per replica: argv,
  ``CUDA_VISIBLE_DEVICES``, port).
- :class:`Supervisor` / :class:`SupervisorThread`: start the replicas, wait for
  ``/health``, restart with backoff, drain on stop, log their output.
- :func:`figures_from_text` / :func:`interval`: vLLM's ``/metrics`` across metric-name
  versions (prefix-cache hits and queries in tokens, KV usage, queue, TTFT).

vLLM itself is the optional ``[local]`` extra; nothing here imports it.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from local_backend._vllm_config import (
    FLAG_OF_KNOB,
    KvCacheDtype,
    LaunchError,
    Quantization,
    ReplicaPlan,
    SpeculativeDecoding,
    SpeculativeMethod,
    VllmLaunch,
    plan_replicas,
)
from local_backend._vllm_metrics import (
    IntervalFigures,
    Sample,
    VllmFigures,
    figures_from_samples,
    figures_from_text,
    histogram_quantile,
    interval,
    parse_prometheus_text,
)
from local_backend._vllm_supervisor import Replica, ReplicaState, Supervisor, SupervisorThread

__all__ = [
    "FLAG_OF_KNOB",
    "IntervalFigures",
    "KvCacheDtype",
    "LaunchError",
    "Quantization",
    "Replica",
    "ReplicaPlan",
    "ReplicaState",
    "Sample",
    "SpeculativeDecoding",
    "SpeculativeMethod",
    "Supervisor",
    "SupervisorThread",
    "VllmFigures",
    "VllmLaunch",
    "figures_from_samples",
    "figures_from_text",
    "histogram_quantile",
    "interval",
    "load_launch_file",
    "parse_prometheus_text",
    "plan_replicas",
]


def load_launch_file(path: str) -> VllmLaunch:
    """Read a ``switchyard local serve`` config: a YAML mapping of :class:`VllmLaunch` knobs.

    Raises :class:`LaunchError` with every problem, each with its key path.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise LaunchError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise LaunchError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a launch config is a YAML mapping of vLLM knobs")
    try:
        launch = VllmLaunch.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{path}: {where}: {message.removeprefix('Value error, ')}")
        raise LaunchError("\n".join(lines)) from None
    if not launch.model:
        raise LaunchError(f"{path}: model: required (the model vLLM loads: a Hugging Face id or a path)")
    return launch
