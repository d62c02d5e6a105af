"""The simulator's settings: model profiles and :class:`SimConfig`, from YAML and flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

import yaml

from local_backend.sim._faults import FaultRule, parse_fault_rule
from local_backend.sim._tokens import CacheModel

TemplateStrictness = Literal["any", "first"]


@dataclass(frozen=True)
class ModelProfile:
    """Latency and output shape of one simulated model (times in milliseconds).

    ``jitter_ms`` is the standard deviation applied to TTFT and to each inter-token gap
    (seeded RNG, clamped at zero); ``prefill_ms_per_1k_tokens`` is added to the TTFT for
    the *uncached* prompt tokens only; ``output_tokens`` is the inclusive range of natural
    answer lengths, chosen from a hash of the prompt.
    """

    ttft_ms: float = 20.0
    itl_ms: float = 2.0
    jitter_ms: float = 0.0
    prefill_ms_per_1k_tokens: float = 0.0
    output_tokens: tuple[int, int] = (16, 48)
    embedding_dim: int = 64

    def __post_init__(self) -> None:
        # YAML gives lists; a frozen dataclass still has to hold a tuple.
        object.__setattr__(self, "output_tokens", tuple(self.output_tokens))
        for name in ("ttft_ms", "itl_ms", "jitter_ms", "prefill_ms_per_1k_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if len(self.output_tokens) != 2 or not 0 <= self.output_tokens[0] <= self.output_tokens[1]:
            raise ValueError(
                f"output_tokens must be (low, high) with 0 <= low <= high, got {self.output_tokens}"
            )
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")


def _default_models() -> dict[str, ModelProfile]:
    return {"sim-fast": ModelProfile(ttft_ms=15, itl_ms=2), "sim-strong": ModelProfile(ttft_ms=60, itl_ms=6)}


@dataclass
class SimConfig:
    """Everything the simulator is told at start (see the module docstring of
    :mod:`local_backend.sim` for what each setting does). ``faults`` are the rules in
    force at start (``--fault``); ``POST /sim/reset`` clears them like any other."""

    models: dict[str, ModelProfile] = field(default_factory=_default_models)
    accept_any_model: bool = False
    cache_model: CacheModel = "vllm"
    block_tokens: int = 16
    cache_capacity_blocks: int = 100_000
    cache_ttl_s: float | None = None
    max_num_seqs: int = 256
    require_api_key: str | None = None
    seed: int = 0
    chunk_tokens: int = 1
    template: TemplateStrictness = "any"
    """Where the model's chat template takes a system message: ``any`` (anywhere),
    ``first`` (only as the first message: a later one is refused, as many templates raise)."""
    faults: list[FaultRule] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.template not in get_args(TemplateStrictness):
            raise ValueError(f"template must be one of {get_args(TemplateStrictness)}, got {self.template!r}")
        if self.cache_model not in get_args(CacheModel):
            raise ValueError(f"cache_model must be one of {get_args(CacheModel)}, got {self.cache_model!r}")
        for name in ("block_tokens", "max_num_seqs", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_capacity_blocks < 0:
            raise ValueError(f"cache_capacity_blocks must be >= 0, got {self.cache_capacity_blocks}")
        if self.cache_ttl_s is not None and self.cache_ttl_s <= 0:
            raise ValueError(f"cache_ttl_s must be > 0, got {self.cache_ttl_s}")


def _fault_rule(spec: Any) -> FaultRule:
    if isinstance(spec, str):
        return parse_fault_rule(spec)
    if isinstance(spec, dict):
        return FaultRule(**spec)
    raise ValueError(f"a fault rule is 'MODEL:SPEC[@RATE][#COUNT]' or a mapping, got {spec!r}")


def config_from_mapping(data: dict[str, Any]) -> SimConfig:
    """A :class:`SimConfig` from a mapping of its fields; ``models`` maps names to profile
    fields, ``faults`` lists ``--fault`` strings or ``{model, fault, rate, count}`` mappings."""
    data = dict(data)
    unknown = set(data) - {f.name for f in fields(SimConfig)}
    if unknown:
        raise ValueError(f"unknown simulator settings: {sorted(unknown)}")
    models = data.pop("models", None)
    faults = data.pop("faults", None)
    config = SimConfig(**data)
    if models is not None:
        if not isinstance(models, dict) or not models:
            raise ValueError("models must be a non-empty mapping of name -> profile fields")
        config.models = {str(name): ModelProfile(**(spec or {})) for name, spec in models.items()}
    if faults is not None:
        config.faults = [_fault_rule(spec) for spec in faults]
    return config


def load_config_file(path: str) -> SimConfig:
    """Read a YAML mapping of :class:`SimConfig` fields (see :func:`config_from_mapping`)."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the simulator config must be a YAML mapping")
    return config_from_mapping(data)


def parse_model_flag(text: str) -> tuple[str, ModelProfile]:
    """``NAME[:TTFT_MS[:ITL_MS]]``; trailing parts that are not numbers belong to the name,
    so ``qwen:7b`` is a name and ``qwen:7b:30:4`` is that name with 30/4 ms."""
    parts = text.split(":")
    numbers: list[float] = []
    while len(parts) > 1 and len(numbers) < 2:
        try:
            numbers.insert(0, float(parts[-1]))
        except ValueError:
            break
        parts.pop()
    name = ":".join(parts)
    if not name:
        raise ValueError(f"--model {text!r}: empty model name")
    profile = ModelProfile()
    if numbers:
        profile = replace(profile, ttft_ms=numbers[0])
    if len(numbers) > 1:
        profile = replace(profile, itl_ms=numbers[1])
    return name, profile


def _output_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    return (int(low), int(high)) if sep else (int(low), int(low))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's flags; each one given overrides the ``--config`` file."""
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, default=8001, help="port to listen on; 0 picks a free one (default 8001)")
    add("--config", metavar="FILE.yaml", help="YAML mapping of SimConfig fields (models: name -> profile)")
    add(
        "--model",
        action="append",
        metavar="NAME[:TTFT_MS[:ITL_MS]]",
        help="serve this model (repeatable; replaces sim-fast 15/2 ms and sim-strong 60/6 ms)",
    )
    add("--prefill-ms-per-1k", type=float, help="every model: prefill ms per 1,000 uncached prompt tokens")
    add("--jitter-ms", type=float, help="every model: std-dev of TTFT and inter-token latency")
    add(
        "--output-tokens", type=_output_range, metavar="LOW[:HIGH]", help="every model: natural answer length"
    )
    add("--accept-any-model", action="store_true", default=None, help="serve unknown model names too")
    add("--cache-model", choices=list(get_args(CacheModel)), help="prefix cache behaviour (default vllm)")
    add("--cache-blocks", type=int, help="prefix cache capacity in blocks per model (default 100000)")
    add("--block-tokens", type=int, help="tokens per cache block (default 16)")
    add("--cache-ttl-s", type=float, help="cache entries expire after this idle time")
    add("--max-num-seqs", type=int, help="requests running at once per model; more wait (default 256)")
    add("--chunk-tokens", type=int, help="tokens per SSE chunk (default 1)")
    add("--require-api-key", metavar="KEY", help="answer 401 unless 'Authorization: Bearer KEY'")
    add("--fault", action="append", metavar="MODEL:SPEC[@RATE][#COUNT]", help="fault rule (repeatable)")
    add("--seed", type=int, help="seed of the fault and jitter RNGs (default 0)")
    add(
        "--template",
        choices=list(get_args(TemplateStrictness)),
        help="where the chat template takes a system message: any (default) or first (a later one is a 400)",
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the parsed flags describe; raises ``ValueError`` when invalid."""
    config = load_config_file(args.config) if args.config else SimConfig()
    if args.model:
        config.models = dict(parse_model_flag(m) for m in args.model)
    overrides: dict[str, Any] = {}
    if args.prefill_ms_per_1k is not None:
        overrides["prefill_ms_per_1k_tokens"] = args.prefill_ms_per_1k
    if args.jitter_ms is not None:
        overrides["jitter_ms"] = args.jitter_ms
    if args.output_tokens is not None:
        overrides["output_tokens"] = args.output_tokens
    if overrides:
        config.models = {name: replace(p, **overrides) for name, p in config.models.items()}
    for attr, value in (
        ("accept_any_model", args.accept_any_model),
        ("cache_model", args.cache_model),
        ("cache_capacity_blocks", args.cache_blocks),
        ("block_tokens", args.block_tokens),
        ("cache_ttl_s", args.cache_ttl_s),
        ("max_num_seqs", args.max_num_seqs),
        ("chunk_tokens", args.chunk_tokens),
        ("require_api_key", args.require_api_key),
        ("seed", args.seed),
        ("template", args.template),
    ):
        if value is not None:
            setattr(config, attr, value)
    config.__post_init__()  # re-validate after the overrides
    config.faults.extend(parse_fault_rule(f) for f in args.fault or ())
    return config
